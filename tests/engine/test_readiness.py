"""TTS_READY=first (issue 44): while the graphs of larger batch buckets are still captured, admission grows only
through buckets already captured, and the engine says what is captured and what is pending.

Three levels, all on the CPU (CUDA graphs cannot run here): the torch-free scheduler under a random load with an
admission cap that rises as "captures" land (no plan ever runs a bucket above the cap); the device plane's
readiness logic (Device.admit_rows, grow, graph_status) over graph sets whose captures the test fills in by hand;
and the codec's calls split into captured row counts while a larger one is pending.
"""

from __future__ import annotations

import pickle
import random
import threading
from types import SimpleNamespace

import pytest

from ttsengine.engine.control.scheduler import Job, Scheduler
from ttsengine.engine.device.cuda_graphs import GraphSet
from ttsengine.engine.device.device import Device
from ttsengine.engine.device.vocoder import Vocoder
from ttsengine.engine.stats import EngineStats, GraphStatus

BUCKETS = (1, 2, 4, 8, 16)


def bucket_of(rows: int) -> int:
    return next(b for b in BUCKETS if b >= rows)


@pytest.mark.parametrize("seed", range(5))
def test_admission_never_runs_a_bucket_not_captured_yet(seed):
    rnd = random.Random(seed)
    s = Scheduler(16, 64, 4096, 16, 256, bucket=bucket_of)
    captured = [1]  # the smallest is captured before ready
    steps_capped = 0
    for step in range(400):
        for _ in range(rnd.choice((0, 0, 1, 5))):
            if len(s.waiting) < 60:
                s.submit(Job(rnd.randint(2, 40), rnd.randint(2, 30)))
        if step % 25 == 24 and len(captured) < len(BUCKETS):  # a capture lands now and then
            captured.append(BUCKETS[len(captured)])
        s.admit_rows = captured[-1]
        plan = s.schedule()
        assert len(s.running) <= s.admit_rows
        if plan.decodes:
            assert plan.bucket in captured, (plan.bucket, captured)
        steps_capped += s.capped
        if plan.decodes:
            tokens = [1 if rnd.random() < 0.1 else 0 for _ in plan.rows]
            for job in plan.rows:
                if job is not None:
                    job.in_flight -= 1
            s.record_frames(tokens, eos_id=1, makers=plan.rows)
            s.release([j for j in plan.rows if j is not None and j.finish_reason])
    assert steps_capped > 0  # the cap did bind: the test exercised it
    assert captured == list(BUCKETS)


def test_capped_means_jobs_wait_for_the_cap_alone():
    s = Scheduler(8, 16, 1024, 16, 256, bucket=bucket_of)
    for _ in range(4):
        s.submit(Job(4, 4))
    s.admit_rows = 2
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 2 and s.capped
    s.admit_rows = 8  # the captures landed: the rest go in at the next step
    s.schedule()
    assert len(s.running) == 4 and not s.capped


# ---- the device plane's readiness logic, over hand-filled graph sets ----------------------------------------
def graph_set(kind: str, keys: list) -> GraphSet:
    g = GraphSet(kind, threading.RLock(), lambda key, *inputs: None)
    g.plan(keys)
    return g


def captured(g: GraphSet, *keys) -> None:
    for key in keys:
        g.graphs[key] = object()  # stands for a recorded graph


class FakeVocoder:
    """The Vocoder's readiness surface: its codec graph set, pending_rows, and a worker that runs calls when told."""

    def __init__(self, rows: list[int], sizes=(4, 8)):
        self.graphs = graph_set("codec", [(r, s) for r in rows for s in sizes])
        self.calls: list = []

    pending_rows = Vocoder.pending_rows

    def call_async(self, fn):
        self.calls.append(fn)
        return lambda: None

    def capture_next(self) -> None:
        captured(self.graphs, *[k for k in self.graphs.pending if k[0] == self.pending_rows[0]])

    def work(self) -> None:
        """The codec thread runs what was queued."""
        calls, self.calls = self.calls, []
        for fn in calls:
            fn()


def fake_device(ready_all=False, gate: threading.Event | None = None) -> Device:
    d = Device.__new__(Device)  # the readiness methods read only these
    d.settings = SimpleNamespace(buckets=BUCKETS, max_slots=16, ready_all=ready_all)
    d.graphs = graph_set("decode-step", list(BUCKETS))
    d.vocoder = FakeVocoder([1, 2, 4, 8])  # the codec's graphs stop below the step's largest bucket
    d.runner = SimpleNamespace(prefill_graphs=graph_set("prefill", [(1, 64, 0), (2, 64, 0), (1, 128, 0)]))
    d._gate, d._codec_growing = gate, None
    captured(d.graphs, 1)
    captured(d.vocoder.graphs, (1, 4), (1, 8))
    return d


def test_admission_cap_follows_the_decode_and_codec_captures():
    d = fake_device()
    assert d.admit_rows() == 1
    captured(d.graphs, 2, 4)
    assert d.admit_rows() == 1  # the codec's 2-row graphs are not in yet
    captured(d.vocoder.graphs, (2, 4))
    assert d.admit_rows() == 1  # every chunk size of a row count
    captured(d.vocoder.graphs, (2, 8))
    assert d.admit_rows() == 2
    d.graphs.failed.add(8)  # a failed capture is given up: it runs uncaptured, waiting gains nothing
    captured(d.vocoder.graphs, (4, 4), (4, 8), (8, 4), (8, 8))
    assert d.admit_rows() == 8
    captured(d.graphs, 16)  # above the codec's largest graph the codec runs pieces of it
    assert d.admit_rows() == 16


def test_grow_captures_the_codec_rows_on_its_thread_then_hands_the_decode_bucket_to_its_first_use():
    d = fake_device()
    assert d.grow() == 0 and len(d.vocoder.calls) == 1  # bucket 2's codec rows, queued on the codec thread
    assert d.grow() == 0 and len(d.vocoder.calls) == 1  # one at a time: nothing more while it runs
    d.vocoder.work()
    assert d.vocoder.pending_rows == [4, 8] and d.admit_rows() == 1
    assert d.grow() == 2  # the next step runs at bucket 2 and captures it at its first use
    assert d.vocoder.calls == []
    captured(d.graphs, 2)  # (what GraphSet.run does on that step)
    assert d.admit_rows() == 2
    assert d.grow() == 0 and len(d.vocoder.calls) == 1  # then bucket 4's codec rows


def test_grow_waits_for_the_fleet_gate():
    gate = threading.Event()
    d = fake_device(gate=gate)
    assert d.grow() == 0 and d.vocoder.calls == []
    gate.set()
    assert d.grow() == 0 and len(d.vocoder.calls) == 1


def test_graph_status_says_what_is_captured_and_pending_and_crosses_a_process_boundary():
    d = fake_device()
    status = d.graph_status()
    assert status == GraphStatus(ready="first", decode_captured=(1,), decode_pending=(2, 4, 8, 16),
                                 codec_captured=(1,), codec_pending=(2, 4, 8), prefill_captured=0,
                                 prefill_pending=3, admit_streams=1)
    assert not status.done
    assert status.as_dict()["decode_buckets"] == {"captured": [1], "pending": [2, 4, 8, 16]}
    stats = EngineStats(device="cuda:0", codec_device="cuda:0", state="ready", graphs=status)
    assert pickle.loads(pickle.dumps(stats)) == stats
    captured(d.graphs, *BUCKETS[1:])
    captured(d.vocoder.graphs, *d.vocoder.graphs.pending)
    captured(d.runner.prefill_graphs, *d.runner.prefill_graphs.pending)
    done = d.graph_status()
    assert done.done and done.admit_streams == 16 and done.prefill_captured == 3
    assert EngineStats.sum([stats]).engines[0].graphs == status


def test_without_graphs_everything_is_admitted_and_nothing_pending():
    d = fake_device(ready_all=True)
    d.graphs = None
    assert d.admit_rows() == 16 and d.grow() == 0
    assert d.graph_status() == GraphStatus(ready="all", admit_streams=16)


# ---- the codec: calls of rows not captured yet run as pieces of captured rows ----------------------------------
def test_codec_pieces_while_a_row_count_is_pending():
    v = Vocoder.__new__(Vocoder)
    v.buckets, v.chunk_sizes = BUCKETS, (4, 8)
    v.graphs = graph_set("codec", [(r, s) for r in (1, 2, 4, 8) for s in (4, 8)])
    v._graph_rows, v.pieces_while_pending = 8, True
    captured(v.graphs, (1, 4), (1, 8), (2, 4))
    assert v._piece_rows(6, 4) == 2  # 8 rows pending: pieces of the largest captured for 4 frames
    assert v._piece_rows(6, 8) == 1
    assert v._piece_rows(2, 3) == 8  # captured (3 frames pad to 4): one call
    assert v._piece_rows(12, 4) == 8  # above the largest planned graph: pieces of it, as before
    v.pieces_while_pending = False
    assert v._piece_rows(6, 4) == 8  # TTS_READY=all / lazy off: a pending shape captures at first use


def test_a_first_use_does_not_wait_behind_another_threads_capture():
    """TTS_READY=first: the codec's capture on its thread holds the lock for seconds (cuDNN tuning); a prefill's or
    step's first use meanwhile runs uncaptured (its graph is recorded at a later use) instead of stalling the loop."""
    ran = []
    g = GraphSet("prefill", threading.RLock(), lambda key, *inputs: ran.append(key) or key)
    g.plan([(1, 64, 0)])
    g.first_use_waits = False
    held, release = threading.Event(), threading.Event()

    def capture_elsewhere():
        with g.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=capture_elsewhere)
    t.start()
    try:
        assert held.wait(10)
        assert g.run((1, 64, 0)) == (1, 64, 0) and ran == [(1, 64, 0)]
        assert g.pending == [(1, 64, 0)] and not g.failed  # still to capture, not given up
    finally:
        release.set()
        t.join()
