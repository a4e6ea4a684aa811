"""Several engines on GPUs (marker `gpu`): each replica and the split topology give the single engine's frames,
and one engine failing mid-run leaves the other serving with no request hanging. Two GPUs when the machine has
them (cuda:0,cuda:1), else two engines on cuda:0 (the same code; split then needs a second GPU and is skipped).
`python -m pytest -m gpu tests/engine/test_fleet_gpu.py`"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR
from torch_helpers import no_tf32

from ttsengine import Engine, EngineConfig, EngineDown, Fleet, SynthesisRequest

pytestmark = pytest.mark.gpu
REQUEST = SynthesisRequest(text="A second, rather longer sentence for the batch.", seed=2, max_new_tokens=64,
                           temperature=0.6, repetition_penalty=1.3)
TWO = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def devices() -> str:
    return "cuda:0,cuda:1" if TWO else "cuda:0,cuda:0"


def cfg(**kw) -> EngineConfig:
    """The DualAR in bf16 (its frames must be equal bit for bit), the codec in fp32 without TF32: each engine's
    cuDNN autotuning may pick other convolution algorithms, equal only to rounding."""
    return EngineConfig(model_dir=MODEL_DIR, max_batch=8, kv_cache_tokens=16384, codec_dtype="float32", **kw)


@pytest.fixture(scope="module", autouse=True)  # before the module's reference engine
def exact_convolutions():
    with no_tf32():
        yield


def frames_of(engine: Engine, request: SynthesisRequest) -> tuple[np.ndarray, np.ndarray]:
    """(every frame the request generated [T, n+1], its audio), with the engine otherwise idle."""
    seen = []
    original = engine._close

    def spy(task, reason):
        seen.append(np.stack(task.frames))
        original(task, reason)

    engine._close = spy
    try:
        audio = engine.submit(request).result().audio
    finally:
        engine._close = original
    return np.concatenate(seen), audio


@pytest.fixture(scope="module")
def reference():
    engine = Engine.load(cfg(device="cuda:0"))
    try:
        yield frames_of(engine, REQUEST)
    finally:
        engine.close()


def test_every_replica_makes_the_single_engines_frames(reference):
    fleet = Fleet.load(cfg(devices=devices()))
    try:
        assert fleet.wait_all(300) and all(e.state == "ready" for e in fleet.engines)  # all warm, not only the first
        for engine in fleet.engines:
            frames, audio = frames_of(engine, REQUEST)
            assert np.array_equal(frames, reference[0]), engine.runner.device
            assert np.abs(audio - reference[1]).max() < 1e-3
        assert len({str(e.runner.device) for e in fleet.engines}) == (2 if TWO else 1)
    finally:
        fleet.close()


@pytest.mark.skipif(not TWO, reason="the split topology needs two GPUs")
def test_the_split_topology_makes_the_single_engines_frames(reference):
    fleet = Fleet.load(cfg(devices="cuda:0,cuda:1", topology="split"))
    try:
        (engine,) = fleet.engines
        assert (str(engine.runner.device), str(engine.vocoder.device)) == ("cuda:0", "cuda:1")
        frames, audio = frames_of(engine, REQUEST)
        assert np.array_equal(frames, reference[0]) and np.abs(audio - reference[1]).max() < 1e-3
    finally:
        fleet.close()


def test_one_engine_failing_mid_run_leaves_the_other_serving():
    fleet = Fleet.load(cfg(devices=devices(), fail_engine="1@40"))
    try:
        assert fleet.wait_all(300) and all(e.state == "ready" for e in fleet.engines)
        long = [SynthesisRequest(text="Keep talking.", seed=10 + i, max_new_tokens=300) for i in range(8)]
        streams = [fleet.submit(r, ignore_stop=True) for r in long]  # alternating: 4 on each engine
        outcome = []
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for future in [pool.submit(s.result) for s in streams]:
                try:
                    outcome.append(future.result(timeout=120).frames)  # no request may hang
                except EngineDown as e:
                    assert str(e).endswith("failed and was taken out of service; see the server logs"), str(e)
                    outcome.append("down")
        assert sorted(outcome, key=str) == [299] * 4 + ["down"] * 4
        stats = fleet.stats()
        assert [e.state for e in stats.engines] == ["ready", "down"] and stats.total.state == "degraded"
        assert "TTS_TEST_FAIL_ENGINE" in stats.engines[1].error  # the reason stays with the engine (and its log)
        after = [fleet.submit(SynthesisRequest(text="After.", seed=i, max_new_tokens=20), ignore_stop=True)
                 for i in range(4)]
        assert [s.result().frames for s in after] == [19] * 4
    finally:
        fleet.close()
