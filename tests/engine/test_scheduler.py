"""The scheduler alone: admission, fairness, backpressure, stop rules, slot compaction."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ttsengine.engine.control.scheduler import Job, Scheduler
from ttsengine.errors import BusyError

EOS = 99


def sched(slots=4, queue=4, pages=100, page=16, prefill=1000, cache=None) -> Scheduler:
    return Scheduler(slots, queue, pages, page, prefill, cache)


def admit(s: Scheduler, budget=None) -> list[Job]:
    """The jobs this step admitted (their first chunks: continuations start past 0)."""
    return [c.job for c in s.schedule(budget).chunks if c.start == 0 or c.job.prefix is not None and
            c.start == c.job.shared_pages * s.page_size]


def test_the_control_plane_imports_no_torch():
    folder = Path(__file__).resolve().parents[2] / "container" / "ttsengine" / "engine" / "control"
    files = sorted(folder.glob("*.py"))
    assert any(f.name == "scheduler.py" for f in files)
    for src in files:
        tree = ast.parse(src.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(name.split(".")[0] in ("torch", "numpy") for name in names), src.name


def test_fifo_admission_fills_slots_in_order():
    s = sched(slots=2)
    jobs = [Job(10, 5) for _ in range(3)]
    for j in jobs:
        s.submit(j)
    assert admit(s) == jobs[:2]
    assert [j.slot for j in jobs[:2]] == [0, 1] and jobs[2].slot is None
    assert admit(s) == []  # no free slot
    s.release([jobs[0]])
    assert admit(s) == [jobs[2]]


def test_the_queue_is_kept_in_deadline_order_ties_by_arrival():
    # segment_slack: a job with slack (a live session's next segment) goes behind those due before it; without
    # slack every deadline is its arrival, so the queue stays first come, first served
    s = sched(slots=1)
    running, patient, a, b, late = Job(10, 5), Job(10, 5, deadline=5.0), Job(10, 5, deadline=2.0), \
        Job(10, 5, deadline=2.0), Job(10, 5, deadline=9.0)
    for j in (running, patient, a, b, late):
        s.submit(j)
    assert list(s.waiting) == [running, a, b, patient, late]
    order = []
    for _ in range(5):
        (job,) = admit(s)
        order.append(job)
        s.release([job])
    assert order == [running, a, b, patient, late]


def test_backpressure_is_immediate():
    s = sched(slots=1, queue=2)
    for _ in range(3):  # the free slot and the two queue places (issue 50: a burst onto idle slots was refused)
        s.submit(Job(10, 5))
    with pytest.raises(BusyError, match="busy"):
        s.submit(Job(10, 5))
    s.submit(Job(10, 5), front=True)  # a long text's next chunk is never refused
    assert s.queue_depth == 4
    assert admit(s) == [s.running[0]] and s.queue_depth == 3  # one running: the queue's two places are full
    with pytest.raises(BusyError, match="busy"):
        s.submit(Job(10, 5))


def test_page_reservations_bound_admission_without_overtaking():
    s = sched(slots=8, pages=10, page=16)
    big, small = Job(100, 60), Job(10, 5)  # 10 pages, 1 page
    s.submit(Job(16, 16))  # 2 pages
    s.submit(big)
    s.submit(small)
    admitted = admit(s)
    assert len(admitted) == 1  # `big` does not fit beside the first; `small` may not overtake it
    assert admit(s) == []
    s.release(admitted)
    assert admit(s) == [big]
    with pytest.raises(ValueError, match="1000 KV positions can never be admitted"):
        s.submit(Job(900, 100))  # a job that could never fit would block the queue for good


def test_chunks_within_the_budget_new_first_chunks_before_continuations():
    s = sched(slots=8, prefill=100, page=16)
    long_, mid = Job(301, 5), Job(81, 5)  # 300 and 80 positions to prefill (the last token is the step's input)
    s.submit(long_)
    s.submit(mid)
    step1 = [(c.job, c.start, c.end) for c in s.schedule().chunks]
    assert step1 == [(long_, 0, 100)]  # the budget is spent: `mid` waits, its slot untaken
    assert not long_.decoding and mid.slot is None
    short = Job(31, 5)
    s.submit(short)
    step2 = [(c.job, c.start, c.end) for c in s.schedule().chunks]
    # new requests' first chunks go ahead of the long continuation, which gets what is left
    assert step2 == [(mid, 0, 80), (short, 0, 20)] + [(long_, 100, 116)]  # at least min_chunk (a page)
    assert mid.decoding and not short.decoding
    # continuations: the oldest gets a page first, then the fewest positions left go first
    step3 = [(c.job, c.start, c.end, c.last) for c in s.schedule().chunks]
    assert step3 == [(short, 20, 30, True), (long_, 116, 206, False)] and short.decoding
    step4 = [(c.job, c.start, c.end, c.last) for c in s.schedule().chunks]
    assert step4 == [(long_, 206, 300, True)] and long_.decoding
    assert s.schedule().chunks == []


def test_the_oldest_continuation_is_never_starved():
    s = sched(slots=8, queue=8, prefill=32, page=16)
    old = Job(201, 5)
    s.submit(old)
    s.schedule()
    for _ in range(3):  # a new request every step spends the whole budget on its first chunk
        s.submit(Job(40, 5))
        chunks = s.schedule().chunks
        assert chunks[0].job is not old and chunks[0].tokens == 32
        assert chunks[-1].job is old and chunks[-1].tokens == 16  # one page anyway


def test_the_oldest_continuation_keeps_its_page_when_slots_move():
    # a finished job's slot takes the last slot's job, so a newer long prompt can sit before an older one
    s = sched(slots=3, queue=8, pages=1000, page=16, prefill=32)
    short, old, newer = Job(10, 3), Job(2000, 5), Job(2000, 5)
    for j in (short, old, newer):
        s.submit(j)
    s.schedule()
    s.schedule()
    assert short.decoding and [j.slot for j in (short, old, newer)] == [0, 1, 2]
    s.release([short])
    assert (newer.slot, old.slot) == (0, 1)
    for _ in range(3):  # a new request every step takes the budget; the oldest prompt still gets its page
        s.submit(Job(100, 5))
        before = old.prefilled
        chunks = s.schedule().chunks
        assert chunks[0].tokens == 32 and [c.job for c in chunks[1:]] == [old] and old.prefilled == before + 16
        s.release([chunks[0].job])


def test_a_smaller_budget_is_honoured_and_one_token_prompts_only_arm():
    s = sched(slots=8, prefill=100)
    a, one = Job(50, 5), Job(1, 5)
    s.submit(a)
    s.submit(one)
    chunks = s.schedule(budget=30).chunks  # the adaptive budget (prefill_budget.py) may lower the limit, never raise it
    assert [(c.job, c.tokens) for c in chunks] == [(a, 30)]
    chunks = s.schedule(budget=1000).chunks
    assert [(c.job, c.start, c.end, c.last) for c in chunks] == [(one, 0, 0, True), (a, 30, 49, True)]


def test_a_budget_by_rows_admits_a_burst_at_each_size_pace():
    # the engine's budget is a function of the rows the step will run: each admission is checked at the rows it
    # brings, so a burst onto a small batch goes in at the small step's room, not the full batch's
    s = sched(slots=16, queue=16, prefill=1000)
    jobs = [Job(11, 5) for _ in range(10)]  # 10 prefill positions each
    for j in jobs:
        s.submit(j)
    seen = []

    def budget(rows):
        seen.append(rows)
        return 100 if rows <= 4 else 25

    chunks = s.schedule(budget).chunks
    assert [(c.job, c.tokens) for c in chunks] == [(j, 10) for j in jobs[:4]]  # the 5th would make it a 5-row step
    assert max(seen) == 5
    # the same burst under the budget of the full batch (what a fixed number at the final bucket gives): 25 positions
    s2 = sched(slots=16, queue=16, prefill=1000)
    for _ in range(10):
        s2.submit(Job(11, 5))
    assert [c.tokens for c in s2.schedule(25).chunks] == [10, 10, 5]
    # a budget the admitted positions already fill at the next row count stops admission there
    s3 = sched(slots=16, queue=16, prefill=1000)
    a, b = Job(11, 5), Job(11, 5)
    s3.submit(a)
    s3.submit(b)
    assert [(c.job, c.tokens) for c in s3.schedule(lambda rows: 10 if rows <= 1 else 5).chunks] == [(a, 10)]


def test_record_frames_skips_jobs_still_prefilling():
    s = sched(slots=4, prefill=10)
    done_, later = Job(5, 3), Job(40, 3)
    s.submit(done_)
    s.submit(later)
    s.schedule()  # done_ whole (4), later's first 6
    assert done_.decoding and not later.decoding
    assert s.record_frames([1, EOS], EOS) == [] and (done_.generated, later.generated) == (1, 0)


def test_stop_and_length_rules():
    s = sched()
    a, b, c = Job(5, 3), Job(5, 10), Job(5, 10, stop_on_eos=False)
    for j in (a, b, c):
        s.submit(j)
    admit(s)
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
    admit(s)
    assert s.record_frames([EOS], EOS) == []  # generated becomes 1: that is the prefill frame


def test_release_compacts_slots():
    s = sched(slots=5, queue=8)
    jobs = [Job(5, 5) for _ in range(5)]
    for j in jobs:
        s.submit(j)
    admit(s)
    moves = s.release([jobs[1], jobs[4], jobs[2]])
    assert [j.slot for j in s.running] == [0, 1, 2][: len(s.running)]
    assert s.running == [jobs[0], jobs[3]]
    assert moves == [(3, 2), (2, 1)]  # freed from the top down; each hole takes the current last job
    assert s.pool.reserved == 2


def test_cancel_waiting_and_cancel_running():
    s = sched(slots=1)
    a, b = Job(5, 50), Job(5, 50)
    s.submit(a)
    s.submit(b)
    admit(s)
    b.cancelled = True
    assert s.cancel_waiting() == [b] and s.queue_depth == 0
    a.cancelled = True
    assert s.record_frames([1], EOS) == [a] and a.finish_reason == "cancelled"
