"""SageMaker: `python -m handlers serve` for real (uvicorn, /ping before and after warm-up, every Accept type,
streaming, custom attributes, async-sized payloads, bad input), and script mode: the four functions of
code/inference.py imported from an extracted model.tar.gz in a fresh interpreter."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import av
import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import MODEL_DIR, ROOT, complete_model, free_port, run_cli

FRAMES = 20


def model_copy(tmp_path):
    d = complete_model(tmp_path / "opt-ml-model")
    for p in d.iterdir():
        p.chmod(0o644)
    return d


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    model = model_copy(tmp_path_factory.mktemp("sm"))
    port = free_port()
    env = {**os.environ, "TTS_MODEL_DIR": str(model), "TTS_DEVICE": "cpu", "SAGEMAKER_BIND_TO_PORT": str(port),
           "TTS_DEFAULT_MAX_NEW_TOKENS": str(FRAMES), "TTS_MAX_BATCH": "4", "TTS_LOG_LEVEL": "WARNING"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "handlers", "serve"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    first = None
    pings = []
    while time.perf_counter() - t0 < 90:
        try:
            t = time.perf_counter()
            r = httpx.get(url + "/ping", timeout=2)
            pings.append((r.status_code, time.perf_counter() - t))
            if first is None:
                first = r.status_code
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    yield url, pings
    proc.terminate()
    proc.wait(timeout=20)


def invoke(url, body, accept=None, content_type="application/json", attrs=None, raw=None):
    headers = {"content-type": content_type}
    if accept:
        headers["accept"] = accept
    if attrs:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = attrs
    return httpx.post(url + "/invocations", content=raw if raw is not None else json.dumps(body), headers=headers,
                      timeout=300)


def seconds_of(data: bytes, mime: str) -> float:
    if mime == "audio/pcm":
        return len(data) / 2 / 24000
    if mime in ("audio/mpeg", "audio/aac"):
        with av.open(io.BytesIO(data)) as c:
            frames = list(c.decode(audio=0))
        return sum(f.samples for f in frames) / frames[0].sample_rate
    audio, rate = sf.read(io.BytesIO(data))
    return len(audio) / rate


def test_ping_answers_fast_and_only_200_when_ready(serve):
    url, pings = serve
    assert pings[-1][0] == 200
    assert all(elapsed < 2.0 for _, elapsed in pings)  # SageMaker's 2 s ping deadline, also during warm-up
    assert {s for s, _ in pings} <= {200, 503}
    head = httpx.head(url + "/ping")
    assert head.status_code == 200 and head.content == b""


@pytest.mark.parametrize("accept", ["audio/wav", "audio/mpeg", "audio/ogg", "audio/flac", "audio/aac", "audio/pcm"])
def test_every_accept_type(serve, accept):
    r = invoke(serve[0], {"text": "Hello from SageMaker.", "seed": 1, "max_new_tokens": FRAMES}, accept=accept)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(accept)
    tol = 0.08 if accept in ("audio/mpeg", "audio/aac") else 0.002
    assert abs(seconds_of(r.content, accept) - (FRAMES - 1) * 2048 / 44100) < tol


def test_json_accept_and_openai_fields(serve):
    r = invoke(serve[0], {"input": "OpenAI style.", "response_format": "flac", "seed": 4}, accept="application/json")
    body = r.json()
    assert r.status_code == 200 and body["format"] == "flac" and body["seed"] == 4
    assert body["frames"] == FRAMES - 1 and body["chunks"][0]["finish_reason"] in ("length", "stop")
    assert abs(seconds_of(base64.b64decode(body["audio"]), "audio/flac") - body["seconds"]) < 0.002


def test_msgpack_body_with_inline_reference(serve):
    import msgpack

    buf = io.BytesIO()
    sf.write(buf, (0.2 * np.random.default_rng(0).standard_normal(20000)).astype(np.float32), 16000, format="WAV")
    body = msgpack.packb({"text": "Cloned.", "references": [{"audio": buf.getvalue(), "text": "noise"}],
                          "max_new_tokens": 10, "format": "wav"})
    r = invoke(serve[0], None, raw=body, content_type="application/x-msgpack")
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"


def test_streaming_invocation_is_self_delimiting(serve):
    lines = []
    with httpx.stream("POST", serve[0] + "/invocations", timeout=300, content=json.dumps(
            {"input": "Streamed through SageMaker.", "response_format": "pcm", "max_new_tokens": 40, "seed": 2}),
            headers={"content-type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "stream=true"}) as r:
        assert r.headers["content-type"].startswith("application/jsonlines")
        raw = b"".join(r.iter_raw())
    # a client that gets the bytes re-chunked anywhere splits records on newlines
    lines = [json.loads(x) for x in raw.split(b"\n") if x]
    assert lines[-1]["done"] is True and lines[-1]["frames"] == 39 and lines[-1]["seed"] == 2
    audio = b"".join(base64.b64decode(rec["audio"]) for rec in lines[:-1])
    assert [rec["index"] for rec in lines[:-1]] == list(range(len(lines) - 1)) and len(lines) > 3
    assert lines[0]["sample_rate"] == 24000 and abs(len(audio) / 2 / 24000 - 39 * 2048 / 44100) < 0.002


def test_unknown_fields_are_ignored_and_named(serve):
    r = invoke(serve[0], {"text": "Hi.", "max_new_tokens": 8, "bogus": 1}, accept="audio/wav")
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "bogus", r.text
    r = invoke(serve[0], {"input": "Hi.", "max_new_tokens": 8, "extra": 2}, attrs="stream=true")
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "extra"
    # the JSON answer says so in its body too: script mode's output_fn has no headers to set
    r = invoke(serve[0], {"text": "Hi.", "max_new_tokens": 8, "bogus": 1}, accept="application/json")
    assert r.status_code == 200 and r.json()["ignored_fields"] == ["bogus"], r.text


def test_no_audio_is_a_422(serve):
    # one frame (max_new_tokens 1) is always dropped: no audio, so no empty 200
    r = invoke(serve[0], {"text": "Nothing.", "max_new_tokens": 1}, accept="audio/wav")
    assert r.status_code == 422 and "produced no audio" in r.json()["error"]["message"], r.text
    r = invoke(serve[0], {"text": "Nothing.", "max_new_tokens": 1}, attrs="stream=true")
    records = [json.loads(x) for x in r.content.split(b"\n") if x]
    assert [rec["error"]["code"] for rec in records] == [422], records


def test_custom_attributes_set_options(serve):
    r = invoke(serve[0], {"text": "Options by header.", "max_new_tokens": FRAMES}, attrs="format=mp3; seed=9")
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg" and r.headers["x-seed"] == "9"
    bad = invoke(serve[0], {"text": "x"}, attrs="colour=red")
    assert bad.status_code == 400 and "unknown option" in bad.json()["error"]["message"]
    # speed with either body style (fish-speech's schema has no speed field: serve applies it after parsing)
    body = {"text": "Faster by header.", "max_new_tokens": FRAMES, "seed": 3, "format": "wav"}
    slow, fast = invoke(serve[0], body), invoke(serve[0], body, attrs="speed=2")
    assert fast.status_code == 200, fast.text
    assert abs(seconds_of(fast.content, "audio/wav") - seconds_of(slow.content, "audio/wav") / 2) < 0.01
    openai = invoke(serve[0], {"input": "Faster by header.", "max_new_tokens": FRAMES, "response_format": "wav"},
                    attrs="speed=2")
    assert openai.status_code == 200, openai.text
    too_fast = invoke(serve[0], body, attrs="speed=9")
    assert too_fast.status_code == 400 and "speed must be within" in too_fast.json()["error"]["message"]


def test_async_inference_sized_work(serve):
    """A long text (chunked into several generations) and a multi-megabyte payload."""
    text = " ".join(f"Sentence number {i} of a long document." for i in range(40))
    r = invoke(serve[0], {"text": text, "max_new_tokens": 6, "chunk_length": 200}, accept="application/json")
    assert r.status_code == 200 and len(r.json()["chunks"]) >= 7
    big = io.BytesIO()
    sf.write(big, (0.1 * np.random.default_rng(1).standard_normal(44100 * 30)).astype(np.float32), 44100,
             format="WAV", subtype="FLOAT")  # ~5 MB of reference audio, ~7 MB as base64
    body = {"text": "With a big reference.", "max_new_tokens": 6,
            "references": [{"audio": base64.b64encode(big.getvalue()).decode(), "text": "noise"}]}
    r = invoke(serve[0], body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("kwargs, status, words", [
    (dict(body=None, raw=b"a,b", content_type="text/csv"), 415, "unsupported content type"),
    (dict(body=None, raw=b"{bad", content_type="application/json"), 400, "not valid JSON"),
    (dict(body={"nothing": 1}), 400, "needs `text`"),
    (dict(body={"text": ""}), 400, "text is empty"),
    (dict(body={"text": "hi", "top_p": 7}), 400, "top_p=7.0 is outside"),
    (dict(body={"input": "hi", "voice": "nobody"}), 400, "unknown voice"),
    (dict(body={"text": "hi"}, accept="image/png"), 406, "cannot produce"),
])
def test_bad_requests(serve, kwargs, status, words):
    r = invoke(serve[0], **kwargs)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


def test_script_mode_tarball_runs_the_four_functions(tmp_path):
    """model.tar.gz with code/: extract like SageMaker does, import code/inference.py in a fresh
    interpreter with only code/ on the path (no repo), run model_fn -> input_fn -> predict_fn -> output_fn."""
    archive = tmp_path / "model.tar.gz"
    proc = subprocess.run([sys.executable, "-m", "infra.sagemaker.package", "--model", str(MODEL_DIR), "--out",
                           str(archive), "--code"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    opt = tmp_path / "opt-ml-model"
    with tarfile.open(archive) as tar:
        tar.extractall(opt)
    assert (opt / "code" / "inference.py").read_text() == (ROOT / "handlers/sagemaker/inference.py").read_text()
    reqs = (opt / "code" / "requirements.txt").read_text()
    assert "tiktoken" in reqs and "torch" not in reqs and "numpy" not in reqs
    script = f"""
import json, sys
sys.path.insert(0, {str(opt / 'code')!r})
import inference, ttsengine
assert ttsengine.__file__.startswith({str(opt)!r}), ttsengine.__file__
model = inference.model_fn({str(opt)!r})
data = inference.input_fn(json.dumps({{"text": "Script mode.", "seed": 3, "max_new_tokens": 12}}), "application/json")
body, ctype = inference.output_fn(inference.predict_fn(data, model), "audio/wav")
print(ctype, len(body))
model.close()
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={**env, "TTS_DEVICE": "cpu"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ctype, size = run.stdout.split()
    assert ctype == "audio/wav" and int(size) == 44 + 11 * 2048 * 2


def test_invoke_cli_through_sagemaker_runtime_api(serve, tmp_path):
    """infra.sagemaker.invoke calls InvokeEndpoint with boto3; `serve` also answers SageMaker Runtime's path."""
    url, _ = serve
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}
    for name in ("out.wav", "out.mp3"):
        proc = run_cli("infra.sagemaker.invoke", "--name", "tts", "--text", "Through boto3.", "--seed", "3",
                       "--out", str(tmp_path / name), "--endpoint-url", url, env=env)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.wav").read_bytes()[:4] == b"RIFF"
    assert (tmp_path / "out.mp3").stat().st_size > 1000
    bad = run_cli("infra.sagemaker.invoke", "--name", "tts", "--text", "x", "--out", str(tmp_path / "x.exe"),
                  "--endpoint-url", url, env=env)
    assert bad.returncode == 1 and "use one of" in bad.stderr and "Traceback" not in bad.stderr


def test_invoke_names_the_inference_component(tmp_path):
    """A real-time endpoint deployed with --scale-to-zero hosts the model as an inference component: each call
    names it (InferenceComponentName); without --component none is named."""
    import io

    from infra.sagemaker.invoke import invoke

    seen = []

    class Runtime:
        def invoke_endpoint(self, **kw):
            seen.append(kw)
            return {"Body": io.BytesIO(b"RIFF")}

        def invoke_endpoint_with_response_stream(self, **kw):
            seen.append(kw)
            return {"Body": [{"PayloadPart": {"Bytes": b'{"done": true}\n'}}]}

    invoke(Runtime(), "tts", {"text": "x"}, tmp_path / "a.wav", False, component="tts-tts")
    invoke(Runtime(), "tts", {"text": "x"}, tmp_path / "b.wav", True, component="tts-tts")
    invoke(Runtime(), "tts", {"text": "x"}, tmp_path / "c.wav", False)
    assert [(kw["EndpointName"], kw.get("InferenceComponentName")) for kw in seen] == \
        [("tts", "tts-tts"), ("tts", "tts-tts"), ("tts", None)]


def test_stream_records_survive_any_payload_split():
    from infra.sagemaker.invoke import records

    lines = b'{"index": 0, "audio": "AAAA"}\n{"index": 1, "audio": "BBBB"}\n{"done": true}\n'
    for cut in range(1, len(lines)):
        parts = [lines[:cut], lines[cut:]]
        assert [r.get("index", "done") for r in records(parts)] == [0, 1, "done"]
