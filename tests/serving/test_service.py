"""The one boot every adapter shares, with a stand-in engine: background and foreground loading, the
ready / failed states health checks report, the voices wired to the engine, and what adapters ask of it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ttsengine import DownloadConfig, EngineConfig, EngineStats, FleetStats, SynthesisRequest
from ttsengine.serving import service as service_module
from ttsengine.serving.failure import ModelFailed, ModelLoading, failure
from ttsengine.serving.service import Service, engine_loader


class FakeEngine:
    """What the service and the adapters use of the engines (a Fleet)."""

    codec_tag, frame_rate, max_streams = "fake-codec", 21.5, 8

    def __init__(self):
        self.ready, self.failure = True, None
        self.submitted, self.closed = [], False

    def voice_codes(self, audio: bytes) -> np.ndarray:
        return np.zeros((4, len(audio)), dtype=np.int64)

    def submit(self, request):
        self.submitted.append(request)
        return "a stream"

    def stats(self) -> FleetStats:
        return EngineStats.sum([EngineStats(device="cpu", codec_device="cpu", state="ready")])

    def close(self) -> None:
        self.closed = True


def settled(svc: Service, timeout: float = 10) -> Service:
    end = time.time() + timeout
    while not (svc.ready or svc.error) and time.time() < end:
        time.sleep(0.01)
    return svc


def test_foreground_load_wires_the_voices(tmp_path):
    engine = FakeEngine()
    svc = Service(lambda: engine, tmp_path / "voices").load()
    assert svc.ready and svc.fleet is engine and svc.error is None and svc.require() is engine
    voice = svc.voices.add("alice", b"abc", "hello")
    assert voice.codes.shape == (4, 3) and svc.voices.root == tmp_path / "voices"
    assert svc.submit(SynthesisRequest(text="hi")) == "a stream" and len(engine.submitted) == 1
    assert svc.max_streams == 8 and svc.stats().total.running == 0
    svc.close()
    assert engine.closed


def test_no_voices_dir_means_no_voices():
    assert Service(FakeEngine, None).load().voices is None


def test_background_load_is_loading_then_ready(tmp_path):
    gate, engine = threading.Event(), FakeEngine()

    def slow():
        gate.wait(10)
        return engine

    svc = Service(slow, tmp_path).start()
    assert not svc.ready and svc.stats() is None
    with pytest.raises(ModelLoading) as e:
        svc.submit(SynthesisRequest(text="hi"))
    assert failure(e.value).status == 503 and failure(e.value).retry_after == 5
    gate.set()
    assert settled(svc).ready and svc.require() is engine


def test_an_engine_that_is_not_warm_yet_is_not_ready(tmp_path):
    engine = FakeEngine()
    engine.ready = False
    svc = Service(lambda: engine, None).load()
    with pytest.raises(ModelLoading):
        svc.require()


def test_a_failed_load_is_reported_not_raised_in_the_background(tmp_path):
    def broken():
        raise FileNotFoundError("model directory not found: /nowhere")

    svc = settled(Service(broken, tmp_path).start())
    assert svc.error == "FileNotFoundError: model directory not found: /nowhere" and not svc.ready
    with pytest.raises(ModelFailed, match="the model failed to load: FileNotFoundError") as e:
        svc.require()
    assert failure(e.value).status == 503
    svc.close()  # nothing to close


def test_an_unusable_voices_dir_disables_voices_only(tmp_path):
    engine = FakeEngine()
    (tmp_path / "file").write_text("not a directory")
    svc = Service(lambda: engine, tmp_path / "file" / "voices")
    svc.load()
    assert svc.fleet is engine and not engine.closed and svc.error is None and svc.voices is None
    assert svc.voices_error.startswith(f"stored voices are disabled: {tmp_path / 'file' / 'voices'} is not usable")


def test_a_failed_foreground_load_raises_and_closes_what_it_made(tmp_path, monkeypatch):
    # a failure after the engine exists (here: the voice store, made to fail otherwise than with an OSError)
    def broken_store(*args):
        raise RuntimeError("voice store exploded")

    monkeypatch.setattr(service_module, "VoiceStore", broken_store)
    engine = FakeEngine()
    svc = Service(lambda: engine, tmp_path / "voices")
    with pytest.raises(RuntimeError):
        svc.load()
    assert engine.closed and svc.fleet is None and svc.error == "RuntimeError: voice store exploded"


def test_engine_loader_fetches_the_model_first_only_with_a_source(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(service_module, "ensure_model", lambda *a: calls.append(("fetch", *a)))
    monkeypatch.setattr(service_module.Fleet, "load", classmethod(lambda cls, config: calls.append(("load",))))
    config = EngineConfig(model_dir=tmp_path)
    engine_loader(config)()
    engine_loader(config, DownloadConfig())()
    assert calls == [("load",), ("load",)]
    engine_loader(config, DownloadConfig(hf_token="t", model_source="hf://a/b"))()
    assert calls[2:] == [("fetch", tmp_path, "hf://a/b", "t"), ("load",)]


class CapturingEngine(FakeEngine):
    """An engine still capturing lazily made CUDA graphs: `pending` of them, one fewer each stats() call."""

    def __init__(self, pending: int):
        super().__init__()
        self.pending = pending

    def stats(self) -> FleetStats:
        now, self.pending = self.pending, max(0, self.pending - 1)
        return EngineStats.sum([EngineStats(device="cuda:0", codec_device="cuda:0", state="ready",
                                            graphs_pending=now)])


def test_settle_waits_for_the_graphs_as_ready_does():
    """RunPod's worker and SageMaker's model_fn take work once load() returns: settle() holds them while /ready
    would say "warming" (issue 44), and not past TTS_READY_MAX_WAIT, nor at all with TTS_READY_WHEN=serving."""
    engine = CapturingEngine(pending=3)
    svc = Service(lambda: engine, None).load()
    svc.settle("settled", 60, poll=0.01)
    assert engine.pending == 0 and svc.warming("settled", 60) == 0
    engine = CapturingEngine(pending=1000)
    svc = Service(lambda: engine, None).load()
    t0 = time.monotonic()
    svc.settle("settled", 0.2, poll=0.01)  # a server under load captures the rest at first use
    assert 0.15 < time.monotonic() - t0 < 5 and engine.pending > 0
    engine = CapturingEngine(pending=1000)
    svc = Service(lambda: engine, None).load()
    assert svc.settle("serving", 60, poll=0.01) < 0.1 and engine.pending == 1000
