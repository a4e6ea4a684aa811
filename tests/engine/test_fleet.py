"""Several engines behind one front, for real on CPU (TTS_DEVICES=cpu,cpu with the tiny golden model): routing,
backpressure over all engines, one engine taken out of service while the other serves on, per-engine stats."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import MODEL_DIR

from ttsengine import BusyError, EngineConfig, EngineDown, EngineStats, Fleet, SynthesisRequest
from ttsengine.engine.presets import by_name
from ttsengine.serving.service import Service

LONG = SynthesisRequest(text="Long.", seed=1, max_new_tokens=2000)


def fleet_of(**config) -> Fleet:
    fleet = Fleet.load(EngineConfig(model_dir=MODEL_DIR, devices="cpu,cpu", max_batch=2, **config))
    assert fleet.wait_all(60)  # ready once the first engine is; the tests want both
    return fleet


def until(condition, timeout: float = 30) -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def fleet():
    f = fleet_of(max_queue=2)
    yield f
    f.close()


def test_each_engine_has_its_own_weights_and_both_give_the_reference_audio(fleet, eager_engine):
    a, b = fleet.engines
    assert a.ckpt.model.norm.weight.data_ptr() != b.ckpt.model.norm.weight.data_ptr()
    assert a.ckpt.codec is not b.ckpt.codec and a.scheduler is not b.scheduler
    req = SynthesisRequest(text="Hello there.", seed=3, max_new_tokens=20)
    before = [e.metrics.requests_done for e in fleet.engines]
    streams = [fleet.submit(req), fleet.submit(req)]  # the second goes to the engine with more free slots
    results = [s.result() for s in streams]
    assert [e.metrics.requests_done - n for e, n in zip(fleet.engines, before)] == [1, 1]
    ref = eager_engine.synthesize(req)
    for got in results:
        assert got.seed == ref.seed and len(got.audio) == len(ref.audio)
        assert np.abs(got.audio - ref.audio).max() < 5e-5


def two_engines(**second) -> tuple[EngineStats, EngineStats]:
    a = EngineStats(
        device="cuda:0", codec_device="cuda:0", state="ready", running=2, waiting=1, frames_per_second=100.0,
        steps=10, frames=40, prefill_tokens=300, vocoded_frames=36, requests_done=3, cancelled=1, rejected=2,
        failed_streams=0, step_seconds=1.0, prefill_seconds=0.5, vocoder_seconds=0.25, loop_seconds=2.0,
        step_wait_seconds=1.5, warmup_seconds=20.0, ttfa_counts=(1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0), ttfa_sum=0.2,
        gpu_memory_allocated_bytes=1000, gpu_memory_reserved_bytes=2000, prefix_hits=4, prefix_misses=1,
        prefix_tokens_saved=256, prefix_evictions=0, prefix_cached_pages=3, quantization="bf16 (none)",
        kernel_cache="blob", precompiled="off", compiled=True, cuda_graphs=True, max_streams=8, kv_positions=4096,
        memory_preset=by_name("h200"))
    b = replace(a, device="cuda:1", codec_device="cuda:1", running=1, waiting=0, frames_per_second=50.0, steps=5,
                frames=20, prefill_tokens=100, vocoded_frames=16, requests_done=2, cancelled=0, rejected=1,
                failed_streams=1, step_seconds=0.5, prefill_seconds=0.25, vocoder_seconds=0.125, loop_seconds=1.0,
                step_wait_seconds=0.5, warmup_seconds=30.0, ttfa_counts=(0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1),
                ttfa_sum=1.5, gpu_memory_allocated_bytes=10, gpu_memory_reserved_bytes=20, prefix_hits=0,
                prefix_misses=2, prefix_tokens_saved=0, prefix_evictions=1, prefix_cached_pages=1,
                kernel_cache="miss", **second)
    return a, b


def test_the_fleet_adds_its_engines_stats():
    a, b = two_engines()
    stats = EngineStats.sum([a, b], rejected=7)
    assert stats.engines == (a, b)
    # the first ready engine's settings, its counters and load added to the other's, by hand
    assert stats.total == replace(
        a, running=3, waiting=1, frames_per_second=150.0, steps=15, frames=60, prefill_tokens=400, vocoded_frames=52,
        requests_done=5, cancelled=1, rejected=7, failed_streams=1, step_seconds=1.5, prefill_seconds=0.75,
        vocoder_seconds=0.375, loop_seconds=3.0, step_wait_seconds=2.0, warmup_seconds=30.0,
        ttfa_counts=(1, 3, 1, 0, 0, 0, 0, 0, 0, 0, 1), ttfa_sum=1.7, gpu_memory_allocated_bytes=1010,
        gpu_memory_reserved_bytes=2020, prefix_hits=4, prefix_misses=3, prefix_tokens_saved=256, prefix_evictions=1,
        prefix_cached_pages=4, max_streams=16, kv_positions=8192)
    assert (stats.total.device, stats.total.kernel_cache, stats.total.state) == ("cuda:0", "blob", "ready")
    assert EngineStats.sum([a, b]).total.rejected == 3  # without the front's count: the engines'


def test_the_fleet_state_is_its_engines_states_together():
    a, b = two_engines(state="down", error="RuntimeError: lost")
    degraded = EngineStats.sum([a, b]).total
    # the first ready engine's settings, the ready engines' streams, every error with its device
    assert (degraded.state, degraded.max_streams, degraded.kernel_cache) == ("degraded", 8, "blob")
    assert degraded.error == "cuda:1: RuntimeError: lost"
    first_down = EngineStats.sum([b, a]).total
    assert (first_down.device, first_down.kernel_cache, first_down.max_streams) == ("cuda:0", "blob", 8)
    loading = replace(a, state="loading", warmup_seconds=None)
    assert EngineStats.sum([loading, b]).total.state == "loading"
    assert EngineStats.sum([loading]).total.warmup_seconds is None
    failed = EngineStats.sum([replace(a, state="failed", error="ValueError: x"), b]).total
    assert (failed.state, failed.max_streams, failed.device) == ("failed", 0, "cuda:0")
    assert failed.error == "cuda:0: ValueError: x; cuda:1: RuntimeError: lost"
    cpu = replace(a, device="cpu", gpu_memory_allocated_bytes=None, gpu_memory_reserved_bytes=None)
    assert EngineStats.sum([cpu, b]).total.gpu_memory_allocated_bytes == 10  # the engines on a GPU
    assert EngineStats.sum([cpu]).total.gpu_memory_reserved_bytes is None


def test_an_engine_process_stats_are_renamed_to_the_fronts_devices():
    # an engine process that sees cuda:3 and cuda:1 as cuda:0 and cuda:1 (feature own_gpu_view)
    a, b = two_engines(state="down", error="RuntimeError: lost")
    seen = EngineStats.sum([a, b])
    named = seen.renamed({"cuda:0": "cuda:3", "cuda:1": "cuda:1"})
    assert [(s.device, s.codec_device) for s in named.engines] == [("cuda:3", "cuda:3"), ("cuda:1", "cuda:1")]
    assert named.engines[1] == b and named.total.error == "cuda:1: RuntimeError: lost"
    assert named.total == replace(seen.total, device="cuda:3", codec_device="cuda:3")
    crossed = EngineStats.sum([replace(a, error="ValueError: x"), b]).renamed({"cuda:0": "cuda:1", "cuda:1": "cuda:0"})
    assert crossed.total.error == "cuda:1: ValueError: x; cuda:0: RuntimeError: lost"
    assert seen.renamed({}) is seen


def test_since_is_the_counters_growth():
    a, b = two_engines()
    later = replace(a, steps=12, frames=48, loop_seconds=2.5, ttfa_counts=(1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                    running=5)
    grown = later.since(a)
    assert (grown.steps, grown.frames, grown.loop_seconds, grown.requests_done) == (2, 8, 0.5, 0)
    assert grown.ttfa_counts == (0, 1) + (0,) * 9
    assert (grown.running, grown.max_streams, grown.device) == (5, 8, "cuda:0")  # gauges and settings: now's


def test_backpressure_counts_every_engine(fleet):
    running = [fleet.submit(LONG, ignore_stop=True) for _ in range(4)]  # 2 slots on each engine
    until(lambda: all(len(e.scheduler.running) == 2 for e in fleet.engines))
    waiting = [fleet.submit(LONG, ignore_stop=True) for _ in range(4)]  # a queue of 2 on each
    assert [e.occupancy() for e in fleet.engines] == [(-2, 2), (-2, 2)]
    rejected = fleet.stats().total.rejected
    t0 = time.perf_counter()
    with pytest.raises(BusyError, match=r"the engines are busy \(4 streams running, 4 waiting\)"):
        fleet.submit(LONG)
    assert time.perf_counter() - t0 < 0.5
    stats = fleet.stats()
    total = stats.total
    assert total.rejected == rejected + 1 and total.running == 4 and total.waiting == 4
    assert total.max_streams == 4 and [e.device for e in stats.engines] == ["cpu", "cpu"]
    for s in running + waiting:
        s.cancel()
    for s in running + waiting:
        list(s)
    until(lambda: all(e.occupancy() == (2, 0) for e in fleet.engines))


def test_an_engine_taken_out_of_service_fails_its_requests_and_the_other_serves_on():
    fleet = fleet_of(fail_engine="1@3")
    try:
        first, second = fleet.submit(LONG, ignore_stop=True), fleet.submit(LONG, ignore_stop=True)
        with pytest.raises(EngineDown, match="^the engine on cpu failed and was taken out of service; see the server "
                                             "logs$"):  # the clients' words: the CUDA error is the log's and stats'
            second.result()  # the second request went to engine 1 (more free slots)
        first.cancel()
        list(first)
        healthy, down = fleet.engines
        assert (healthy.state, down.state) == ("ready", "down") and fleet.route() == [healthy]
        with pytest.raises(EngineDown, match="out of service"):
            down.submit(LONG)
        assert fleet.submit(SynthesisRequest(text="After.", seed=5, max_new_tokens=5)).result().frames == 4
        stats = fleet.stats()
        assert stats.total.state == "degraded" and stats.total.max_streams == 2
        assert [(e.state, e.failed_streams) for e in stats.engines] == [("ready", 0), ("down", 1)]
        assert "cpu: RuntimeError: CUDA error" in stats.total.error
        svc = Service(lambda: fleet, None).load()
        health = svc.health()
        assert health["status"] == "degraded" and svc.ready and svc.error is None
        assert [(e["state"], e["error"]) for e in health["engines"]] == [
            ("ready", None), ("down", "the engine on cpu failed; see the server logs")]
    finally:
        fleet.close()


def test_when_every_engine_is_down_the_front_says_so():
    fleet = Fleet.load(EngineConfig(model_dir=MODEL_DIR, devices="cpu", max_batch=2, fail_engine="0@2"))
    try:
        with pytest.raises(EngineDown):
            fleet.submit(LONG, ignore_stop=True).result()
        assert not fleet.ready and fleet.failure == "every engine failed (cpu); see the server logs"
        with pytest.raises(EngineDown, match="every engine failed"):
            fleet.submit(LONG)
        svc = Service(lambda: fleet, None).load()
        assert svc.health()["status"] == "failed" and svc.error == fleet.failure
    finally:
        fleet.close()


def test_a_voices_requests_go_to_its_home_engine_and_meet_its_cached_prefix():
    from test_prefix_cache import voice_codes

    from ttsengine import Reference
    from ttsengine.engine.fleet import voice_affinity

    fleet = fleet_of(max_queue=4)
    try:
        ref = (Reference(text="a voice of its own", codes=voice_codes(3)),)
        home_index = voice_affinity(SynthesisRequest(text="x", references=ref)) % 2
        home, other = fleet.engines[home_index], fleet.engines[1 - home_index]
        for i in range(4):  # one after another: both engines idle each time, the voice's home takes it
            fleet.submit(SynthesisRequest(text=f"Line {i}.", seed=i, max_new_tokens=6, references=ref)).result()
        assert (home.stats().prefix_misses, home.stats().prefix_hits) == (1, 3)
        assert (other.stats().prefix_misses, other.stats().prefix_hits) == (0, 0)
        # the home engine full: load wins, the other engine takes the voice (and prefills its prefix once)
        busy = [home.submit(LONG, ignore_stop=True) for _ in range(2)]
        until(lambda: len(home.scheduler.running) == 2)
        fleet.submit(SynthesisRequest(text="Elsewhere.", seed=9, max_new_tokens=6, references=ref)).result()
        assert other.stats().prefix_misses == 1
        for s in busy:
            s.cancel()
        # requests without a voice are routed by load alone
        assert voice_affinity(SynthesisRequest(text="no voice")) is None
    finally:
        fleet.close()
