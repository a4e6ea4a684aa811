"""SageMaker with two engines (TTS_DEVICES=cpu,cpu, the tiny model): `python -m handlers serve` for real, with one
engine failing as a lost GPU would (TTS_TEST_FAIL_ENGINE): /ping stays 200 and invocations go on to the other;
and model_fn/predict_fn in process, spreading concurrent predictions over both engines."""

from __future__ import annotations

import io
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import soundfile as sf
from conftest import complete_model
from test_drain import start_serve
from test_http import stop

from handlers.sagemaker import inference

FRAME_SAMPLES = 2048  # 44.1 kHz samples per frame


def model_copy(tmp_path):
    """A complete, writable model directory (model_fn keeps voices beside the model)."""
    return complete_model(tmp_path / "opt-ml-model")


def invoke(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/invocations", content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json", "accept": "audio/wav"})


def frames_of(r: httpx.Response) -> int:
    audio, rate = sf.read(io.BytesIO(r.content))
    assert rate == 44100
    return len(audio) // FRAME_SAMPLES


def concurrently(fn, *args_list) -> list:
    with ThreadPoolExecutor(len(args_list)) as pool:
        return list(pool.map(lambda args: fn(*args), args_list))


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """Two engines; engine 1 fails at its 30th decode step (counted over every request it runs)."""
    proc, url = start_serve(tmp_path_factory.mktemp("sm-engines"), TTS_DEVICES="cpu,cpu", TTS_TEST_FAIL_ENGINE="1@30",
                            TTS_MAX_BATCH="2")
    try:
        time.sleep(0.5)  # the second engine joins the rotation once it is warm (at once on CPU)
        yield url
    finally:
        stop(proc)


def test_ping_and_two_concurrent_invocations(serve):
    assert httpx.get(serve + "/ping").status_code == 200
    # 12 frames each: one request per engine, well short of engine 1's failing step
    bodies = [({"text": f"Concurrent number {i}.", "seed": i, "max_new_tokens": 12},) for i in (1, 2)]
    responses = concurrently(lambda body: invoke(serve, body), *bodies)
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "audio/wav" and frames_of(r) == 11
    assert [r.headers["x-seed"] for r in responses] == ["1", "2"]


def test_an_engine_failure_fails_its_invocation_and_the_other_engine_serves_on(serve):
    # two at once, one per engine; 60 frames each run past engine 1's 30th step
    bodies = [({"text": "Long.", "seed": 1, "max_new_tokens": 60},)] * 2
    t0 = time.perf_counter()
    responses = concurrently(lambda body: invoke(serve, body), *bodies)
    assert time.perf_counter() - t0 < 60
    ok = [r for r in responses if r.status_code == 200]
    failed = [r for r in responses if r.status_code != 200]
    assert len(ok) == 1 and len(failed) == 1, [(r.status_code, r.text[:200]) for r in responses]
    assert frames_of(ok[0]) == 59  # the request on engine 0 is untouched
    bad = failed[0]
    assert bad.status_code == 503 and bad.headers["retry-after"] == "1", bad.text
    error = bad.json()["error"]
    assert error["code"] == 503
    # one public line, as the HTTP server's: the CUDA error's text stays in the server log
    assert error["message"] == "the engine on cpu failed and was taken out of service; see the server logs", error
    assert "Traceback" not in bad.text

    # SageMaker keeps routing here: /ping stays 200 while one engine serves, and invocations work
    ping = httpx.get(serve + "/ping")
    assert ping.status_code == 200 and ping.json() == {"status": "ready"}
    for seed in (3, 4):  # both on engine 0 now
        r = invoke(serve, {"text": "After the failure.", "seed": seed, "max_new_tokens": 16})
        assert r.status_code == 200, r.text
        assert frames_of(r) == 15 and r.headers["x-seed"] == str(seed)
    # a streamed invocation too, to its `done` record
    with httpx.stream("POST", serve + "/invocations", timeout=120, content=json.dumps(
            {"input": "Streamed after.", "response_format": "pcm", "max_new_tokens": 16, "seed": 5}),
            headers={"content-type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "stream=true"}) as r:
        assert r.status_code == 200
        records = [json.loads(line) for line in b"".join(r.iter_raw()).split(b"\n") if line]
    assert records[-1] == {"done": True, "seed": 5, "frames": 15, "seconds": round(15 * 2048 / 44100, 3)}


def test_model_fn_spreads_predictions_over_both_engines(tmp_path, monkeypatch):
    monkeypatch.setenv("TTS_DEVICE", "cpu")
    monkeypatch.setenv("TTS_DEVICES", "cpu,cpu")
    monkeypatch.setenv("TTS_MAX_BATCH", "2")
    monkeypatch.delenv("TTS_TEST_FAIL_ENGINE", raising=False)
    model = inference.model_fn(str(model_copy(tmp_path)))
    try:
        fleet = model.fleet
        assert len(fleet.engines) == 2 and [e.runner.device.type for e in fleet.engines] == ["cpu", "cpu"]
        assert fleet.wait_all(60) and model.health()["status"] == "ok"
        assert model.max_streams == 4
        before = [e.metrics.requests_done for e in fleet.engines]
        data = [(inference.input_fn(json.dumps({"text": f"Prediction {i}.", "seed": i, "max_new_tokens": 12}),
                                    "application/json"),) for i in (1, 2)]
        predictions = concurrently(lambda d: inference.predict_fn(d, model), *data)
        end = time.time() + 10  # counted on the codec thread just after the result is handed over
        while [e.metrics.requests_done - n for e, n in zip(fleet.engines, before)] != [1, 1] and time.time() < end:
            time.sleep(0.02)
        assert [e.metrics.requests_done - n for e, n in zip(fleet.engines, before)] == [1, 1]  # one on each
        for p, seed in zip(predictions, (1, 2)):
            body, ctype = inference.output_fn(p, "audio/wav")
            assert ctype == "audio/wav" and p.result.seed == seed and p.result.frames == 11
            assert len(sf.read(io.BytesIO(body))[0]) == 11 * FRAME_SAMPLES
    finally:
        model.close()
