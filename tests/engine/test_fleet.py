"""Several engines behind one front, for real on CPU (TTS_DEVICES=cpu,cpu with the tiny golden model): routing,
backpressure over all engines, one engine taken out of service while the other serves on, per-engine stats."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import MODEL_DIR

from ttsengine import BusyError, EngineConfig, EngineDown, Fleet, SynthesisRequest
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


def test_backpressure_counts_every_engine(fleet):
    running = [fleet.submit(LONG, ignore_stop=True) for _ in range(4)]  # 2 slots on each engine
    until(lambda: all(len(e.scheduler.running) == 2 for e in fleet.engines))
    waiting = [fleet.submit(LONG, ignore_stop=True) for _ in range(4)]  # a queue of 2 on each
    assert [e.occupancy() for e in fleet.engines] == [(-2, 2), (-2, 2)]
    rejected = fleet.stats()["rejected"]
    t0 = time.perf_counter()
    with pytest.raises(BusyError, match=r"the engines are busy \(4 streams running, 4 waiting\)"):
        fleet.submit(LONG)
    assert time.perf_counter() - t0 < 0.5
    stats = fleet.stats()
    assert stats["rejected"] == rejected + 1 and stats["running"] == 4 and stats["waiting"] == 4
    assert stats["max_streams"] == 4 and [e["device"] for e in stats["engines"]] == ["cpu", "cpu"]
    for s in running + waiting:
        s.cancel()
    for s in running + waiting:
        list(s)
    until(lambda: all(e.occupancy() == (2, 0) for e in fleet.engines))


def test_an_engine_taken_out_of_service_fails_its_requests_and_the_other_serves_on():
    fleet = fleet_of(fail_engine="1@3")
    try:
        first, second = fleet.submit(LONG, ignore_stop=True), fleet.submit(LONG, ignore_stop=True)
        with pytest.raises(EngineDown, match=r"the engine on cpu failed and was taken out of service \(RuntimeError: "
                                             r"CUDA error: an illegal memory access .*TTS_TEST_FAIL_ENGINE\)"):
            second.result()  # the second request went to engine 1 (more free slots)
        first.cancel()
        list(first)
        healthy, down = fleet.engines
        assert (healthy.state, down.state) == ("ready", "down") and fleet.route() == [healthy]
        with pytest.raises(EngineDown, match="out of service"):
            down.submit(LONG)
        assert fleet.submit(SynthesisRequest(text="After.", seed=5, max_new_tokens=5)).result().frames == 4
        stats = fleet.stats()
        assert stats["state"] == "degraded" and stats["max_streams"] == 2
        assert [(e["state"], e["failed_streams"]) for e in stats["engines"]] == [("ready", 0), ("down", 1)]
        assert "cpu: RuntimeError: CUDA error" in stats["error"]
        svc = Service(lambda: fleet, None).load()
        health = svc.health()
        assert health["status"] == "degraded" and svc.ready and svc.error is None
        assert [e["state"] for e in health["engines"]] == ["ready", "down"]
    finally:
        fleet.close()


def test_when_every_engine_is_down_the_front_says_so():
    fleet = Fleet.load(EngineConfig(model_dir=MODEL_DIR, devices="cpu", max_batch=2, fail_engine="0@2"))
    try:
        with pytest.raises(EngineDown):
            fleet.submit(LONG, ignore_stop=True).result()
        assert not fleet.ready and fleet.failure.startswith("every engine failed: cpu: RuntimeError: CUDA error")
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
        assert (home.stats()["prefix_misses"], home.stats()["prefix_hits"]) == (1, 3)
        assert (other.stats()["prefix_misses"], other.stats()["prefix_hits"]) == (0, 0)
        # the home engine full: load wins, the other engine takes the voice (and prefills its prefix once)
        busy = [home.submit(LONG, ignore_stop=True) for _ in range(2)]
        until(lambda: len(home.scheduler.running) == 2)
        fleet.submit(SynthesisRequest(text="Elsewhere.", seed=9, max_new_tokens=6, references=ref)).result()
        assert other.stats()["prefix_misses"] == 1
        for s in busy:
            s.cancel()
        # requests without a voice are routed by load alone
        assert voice_affinity(SynthesisRequest(text="no voice")) is None
    finally:
        fleet.close()
