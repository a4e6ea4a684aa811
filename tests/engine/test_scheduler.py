"""The scheduler alone: admission, fairness, backpressure, stop rules, slot compaction."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ttsengine.engine.scheduler import Job, Scheduler
from ttsengine.errors import BusyError

EOS = 99


def sched(slots=4, queue=4, pages=100, page=16, prefill=1000) -> Scheduler:
    return Scheduler(slots, queue, pages, page, prefill)


def test_imports_no_torch():
    src = Path(__file__).resolve().parents[2] / "container" / "ttsengine" / "engine" / "scheduler.py"
    names = {a.name for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not any(name.split(".")[0] == "torch" for name in names)


def test_fifo_admission_fills_slots_in_order():
    s = sched(slots=2)
    jobs = [Job(10, 5) for _ in range(3)]
    for j in jobs:
        s.submit(j)
    assert s.admit() == jobs[:2]
    assert [j.slot for j in jobs[:2]] == [0, 1] and jobs[2].slot is None
    assert s.admit() == []  # no free slot
    s.release([jobs[0]])
    assert s.admit() == [jobs[2]]


def test_backpressure_is_immediate():
    s = sched(slots=1, queue=2)
    s.submit(Job(10, 5))
    s.submit(Job(10, 5))
    with pytest.raises(BusyError, match="busy"):
        s.submit(Job(10, 5))
    s.submit(Job(10, 5), front=True)  # a long text's next chunk is never refused
    assert s.queue_depth == 3


def test_page_reservations_bound_admission_without_overtaking():
    s = sched(slots=8, pages=10, page=16)
    big, small = Job(100, 60), Job(10, 5)  # 10 pages, 1 page
    s.submit(Job(16, 16))  # 2 pages
    s.submit(big)
    s.submit(small)
    admitted = s.admit()
    assert len(admitted) == 1  # `big` does not fit beside the first; `small` may not overtake it
    assert s.admit() == []
    s.release(admitted)
    assert s.admit() == [big]
    with pytest.raises(ValueError, match="1000 KV positions can never be admitted"):
        s.submit(Job(900, 100))  # a job that could never fit would block the queue for good


def test_prefill_token_budget_but_always_one():
    s = sched(slots=8, prefill=100)
    for n in (80, 80, 30):
        s.submit(Job(n, 5))
    assert [j.prompt_len for j in s.admit()] == [80]
    assert [j.prompt_len for j in s.admit()] == [80]
    s2 = sched(prefill=10)
    s2.submit(Job(500, 5))
    assert len(s2.admit()) == 1  # larger than the budget, admitted alone


def test_stop_and_length_rules():
    s = sched()
    a, b, c = Job(5, 3), Job(5, 10), Job(5, 10, stop_on_eos=False)
    for j in (a, b, c):
        s.submit(j)
    s.admit()
    for j in (a, b, c):
        j.generated = 1  # the prefill frame
    assert s.record_frames([1, EOS, EOS], EOS) == [b]  # c ignores EOS (benchmarks)
    assert b.finish_reason == "stop"
    done = s.record_frames([1, 1, 1], EOS)
    assert a in done and a.finish_reason == "length" and a.generated == 3


def test_eos_on_the_prefill_frame_does_not_stop():
    s = sched()
    j = Job(5, 10)
    s.submit(j)
    s.admit()
    assert s.record_frames([EOS], EOS) == []  # generated becomes 1: that is the prefill frame


def test_release_compacts_slots():
    s = sched(slots=5, queue=8)
    jobs = [Job(5, 5) for _ in range(5)]
    for j in jobs:
        s.submit(j)
    s.admit()
    moves = s.release([jobs[1], jobs[4], jobs[2]])
    assert [j.slot for j in s.running] == [0, 1, 2][: len(s.running)]
    assert s.running == [jobs[0], jobs[3]]
    assert moves == [(3, 2), (2, 1)]  # freed from the top down; each hole takes the current last job
    assert s.reserved_pages == 2


def test_cancel_waiting_and_cancel_running():
    s = sched(slots=1)
    a, b = Job(5, 50), Job(5, 50)
    s.submit(a)
    s.submit(b)
    s.admit()
    b.cancelled = True
    assert s.cancel_waiting() == [b] and s.queue_depth == 0
    a.cancelled = True
    assert s.record_frames([1], EOS) == [a] and a.finish_reason == "cancelled"
