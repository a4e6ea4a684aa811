"""The HTTP app assembled around a stand-in engine, in process (Starlette's TestClient, no socket): the routes
see the service's loading / failed / ready states, the body limit, the API key, the voices routes and the
schema. Audio itself is test_http.py's (the real server with the real engine)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from handlers.http.app import create_app
from ttsengine import EngineConfig, EngineStats, FleetStats, ServerConfig
from ttsengine.engine.presets import Preset


class FakeEngine:
    codec_tag, frame_rate, max_streams = "fake", 21.5, 4

    def __init__(self, graphs_pending: int = 0):
        self.ready, self.failure = True, None
        self.graphs_pending = graphs_pending  # what a GPU engine's lazy start-up still has to capture
        self.asked = 0  # stats() calls: each is a round trip to every engine process when they run in their own

    def voice_codes(self, audio: bytes) -> np.ndarray:
        return np.zeros((4, 10), dtype=np.int64)

    def stats(self) -> FleetStats:
        self.asked += 1
        return EngineStats.sum([EngineStats(
            device="cpu", codec_device="cpu", state="ready", warmup_seconds=1.5, quantization="bf16 (none)",
            kernel_cache="off", ttfa_buckets=(0.1,), ttfa_counts=(0, 0), max_streams=4, kv_positions=4096,
            memory_preset=Preset("cpu", 4, 2048, 1.0), graphs_pending=self.graphs_pending)])

    def close(self) -> None:
        pass


def client(tmp_path, factory, **server) -> TestClient:
    app = create_app(ServerConfig(data_dir=tmp_path, **server), EngineConfig(), engine_factory=factory)
    return TestClient(app)


def settle(c: TestClient) -> None:
    end = time.time() + 10
    while c.get("/ready").json()["status"] == "loading" and time.time() < end:
        time.sleep(0.01)


def test_loading_then_ready(tmp_path):
    gate = threading.Event()

    engine = FakeEngine()

    def slow():
        gate.wait(10)
        return engine

    with client(tmp_path, slow) as c:
        assert c.get("/ready").status_code == 503 and c.get("/ready").json() == {"status": "loading"}
        assert c.get("/health").json() == {"status": "loading"}
        r = c.post("/v1/audio/speech", json={"input": "hi"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"] == {"message": "the model is loading; retry shortly", "type": "server_busy",
                                     "code": 503}
        assert "tts_ready 0" in c.get("/metrics").text
        gate.set()
        settle(c)
        asked = engine.asked
        ready = c.get("/ready").json()
        assert engine.asked == asked + 1  # one stats snapshot serves the warming check, the totals and the engines
        engine = {"index": 0, "device": "cpu", "codec_device": "cpu", "state": "ready", "error": None, "running": 0,
                  "waiting": 0, "max_streams": 4, "graphs_pending": 0}
        assert ready == {"status": "ready", "model": {"dir": str(EngineConfig().model_dir), "source": None},
                         "warmup_seconds": 1.5, "quantization": "bf16 (none)", "kernel_cache": "off",
                         "memory_preset": {"name": "cpu", "max_batch": 4, "positions_per_stream": 2048,
                                           "memory_utilization": 1.0}, "max_streams": 4, "kv_positions": 4096,
                         "graphs_pending": 0, "engines": [engine]}
        assert c.get("/health").json() == {"status": "ok", "engines": [engine]}
        metrics = c.get("/metrics").text
        assert "tts_ready 1.0" in metrics and 'tts_engine_up{device="cpu",engine="0"} 1.0' in metrics


def test_ready_waits_for_the_graphs_left_for_later(tmp_path):
    # TTS_READY_WHEN=settled (default): a serving engine with graphs still to capture is "warming" (503), requests
    # are served meanwhile; once none is left, 200. serving: 200 at once. A server kept busy (its graphs captured only
    # at first use) is ready after TTS_READY_MAX_WAIT all the same, saying how many are left
    engine = FakeEngine(graphs_pending=3)
    with client(tmp_path, lambda: engine) as c:
        settle(c)
        r = c.get("/ready")
        assert r.status_code == 503 and r.json() == {"status": "warming", "graphs_pending": 3}
        assert c.get("/health").json()["engines"][0]["graphs_pending"] == 3
        engine.graphs_pending = 0
        assert c.get("/ready").status_code == 200 and c.get("/ready").json()["graphs_pending"] == 0
    with client(tmp_path, lambda: FakeEngine(graphs_pending=3), ready_when="serving") as c:
        settle(c)
        r = c.get("/ready")
        assert r.status_code == 200 and r.json()["graphs_pending"] == 3
    # (2 s: with 0.3 s, a CI machine running both torch lanes on 2 cores once took longer than that to settle)
    with client(tmp_path, lambda: FakeEngine(graphs_pending=3), ready_max_wait=2.0) as c:
        settle(c)
        assert c.get("/ready").status_code == 503
        time.sleep(2.1)
        r = c.get("/ready")
        assert r.status_code == 200 and r.json()["graphs_pending"] == 3


def test_a_failed_load(tmp_path):
    def broken():
        raise FileNotFoundError("model directory not found: /nowhere")

    with client(tmp_path, broken) as c:
        settle(c)
        r = c.get("/ready")
        assert r.status_code == 503 and r.json() == {"status": "failed",
                                                     "error": "FileNotFoundError: model directory not found: /nowhere"}
        assert c.get("/health").status_code == 500
        r = c.post("/v1/tts", json={"text": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert "the model failed to load: FileNotFoundError" in r.json()["error"]["message"]


def test_bad_bodies_are_400_even_while_loading(tmp_path):
    """FastAPI validates OpenAI's body before the route asks for the engine (as before the router move)."""
    gate = threading.Event()
    with client(tmp_path, lambda: gate.wait(10) and FakeEngine()) as c:
        r = c.post("/v1/audio/speech", json={"input": "hi", "speed": 9})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        gate.set()


@pytest.mark.parametrize("send", [
    dict(json={"input": "x" * 2000}),  # by Content-Length
    dict(content=iter([b'{"input": "', b"x" * 1500, b'"}'])),  # chunked: counted while it arrives
])
def test_body_limit(tmp_path, send):
    with client(tmp_path, FakeEngine, max_body_bytes=1024) as c:
        settle(c)
        r = c.post("/v1/tts", headers={"content-type": "application/json"}, **send)
        assert r.status_code == 413
        assert r.json() == {"error": {"message": "request body over 1024 bytes", "type": "too_large", "code": 413}}


def test_api_key(tmp_path):
    with client(tmp_path, FakeEngine, api_key="s3cret") as c:
        settle(c)
        r = c.get("/v1/voices")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/voices", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/v1/voices", headers={"X-Api-Key": "s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


def test_voices_routes(tmp_path):
    with client(tmp_path, FakeEngine) as c:
        settle(c)
        r = c.post("/v1/references/add", data={"id": "bob", "text": "hi bob"}, files={"audio": ("b.wav", b"RIFF")})
        assert r.status_code == 201 and r.json()["reference_id"] == "bob"
        assert (tmp_path / "voices" / "bob" / "codes.npy").is_file()  # voices live in <data dir>/voices
        assert c.post("/v1/references/add", data={"id": "bob", "text": "x"},
                      files={"audio": ("b.wav", b"RIFF")}).status_code == 409
        assert c.get("/v1/references/list").json() == {"success": True, "reference_ids": ["bob"]}
        assert [v["id"] for v in c.get("/v1/voices").json()["voices"]] == ["default", "bob"]
        assert c.request("DELETE", "/v1/references/delete", json={"reference_id": "bob"}).status_code == 200
        assert c.delete("/v1/references/delete?reference_id=bob").status_code == 404
        assert c.delete("/v1/references/delete").status_code == 400


def test_schema_has_the_fish_speech_body(tmp_path):
    with client(tmp_path, FakeEngine) as c:
        schema = c.get("/openapi.json").json()
        assert "FishTTSRequest" in schema["components"]["schemas"]
        assert {"/v1/audio/speech", "/v1/tts", "/v1/references/add", "/v1/voices", "/health"} <= set(schema["paths"])
        assert "/" not in schema["paths"]


def test_sagemakers_ping_waits_for_the_graphs_as_ready_does(tmp_path):
    # SageMaker routes traffic to a container once /ping says 200: the same rule as /ready (TTS_READY_WHEN)
    from handlers.sagemaker.serve import create_app as sagemaker_app
    from ttsengine.serving.service import Service

    engine = FakeEngine(graphs_pending=2)
    with TestClient(sagemaker_app(ServerConfig(data_dir=tmp_path), Service(lambda: engine, None))) as c:
        end = time.time() + 10
        while "loading" in c.get("/ping").text and time.time() < end:
            time.sleep(0.01)
        r = c.get("/ping")
        assert r.status_code == 503 and "2 CUDA graph(s) still to capture" in r.text
        engine.graphs_pending = 0
        assert c.get("/ping").status_code == 200
