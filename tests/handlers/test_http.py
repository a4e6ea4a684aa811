"""The HTTP server for real: `python -m handlers http` (uvicorn) on a free port with the tiny model on
CPU, driven by httpx; every format decoded back; voices; bad inputs; auth; disconnects; schemathesis."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import httpx
import msgpack
import numpy as np
import pytest
import soundfile as sf
from conftest import MODEL_DIR, ROOT, complete_model, free_port
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

FRAMES = 24  # TTS_DEFAULT_MAX_NEW_TOKENS of the test server: 23 kept frames per request
FRAME_S = 2048 / 44100


def start_server(tmp: Path, **env) -> tuple[subprocess.Popen, str]:
    port = free_port()
    full = {**os.environ, "TTS_MODEL_DIR": str(MODEL_DIR), "TTS_DEVICE": "cpu", "TTS_PORT": str(port),
            "TTS_DATA_DIR": str(tmp / "data"), "TTS_DEFAULT_MAX_NEW_TOKENS": str(FRAMES), "TTS_MAX_BATCH": "4",
            "TTS_LOG_LEVEL": "WARNING", "TTS_DRAIN_SECONDS": "5", **env}  # stop() waits 20 s
    # the output goes to a file (a pipe nobody reads would fill and block the server); server_log() reads it
    log = open(tmp / f"server-{port}.log", "w")  # noqa: SIM115 - the server process writes it until it ends
    proc = subprocess.Popen([sys.executable, "-m", "handlers", "http"], cwd=ROOT, env=full,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()  # the child holds its own copy
    proc.log_path = Path(log.name)
    return proc, f"http://127.0.0.1:{port}"


def server_log(proc: subprocess.Popen) -> str:
    return proc.log_path.read_text(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 90) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited: {server_log(proc)}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("server not ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def served(tmp: Path, **env):
    """A real server on the tiny checkpoint (start_server's settings, `env` over them), ready -> its URL; stopped
    on the way out."""
    proc, url = start_server(tmp, **env)
    try:
        wait_ready(url, proc)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("http"), TTS_MAX_UPLOAD_BYTES="300000",
                             TTS_MAX_BODY_BYTES="2000000")
    wait_ready(url, proc)
    yield url
    stop(proc)


def wav_bytes(seconds: float = 0.6, rate: int = 22050, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, (0.2 * np.random.default_rng(seed).standard_normal(int(seconds * rate))).astype(np.float32),
             rate, format="WAV")
    return buf.getvalue()


def duration(data: bytes, fmt: str, rate: int = 24000) -> float:
    if fmt == "pcm":
        return len(data) / 2 / rate
    if fmt in ("wav", "flac", "opus"):
        audio, r = sf.read(io.BytesIO(data))
        return len(audio) / r
    with av.open(io.BytesIO(data)) as c:  # mp3, aac
        frames = [f for f in c.decode(audio=0)]
    return sum(f.samples for f in frames) / frames[0].sample_rate


def speech(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={"input": "Hello there.", "seed": 1, **body}, timeout=120)


@pytest.mark.parametrize("fmt", ["wav", "pcm", "mp3", "opus", "aac", "flac"])
def test_every_format_decodes_to_the_expected_duration(server, fmt):
    r = speech(server, response_format=fmt)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith({"wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg",
                                                 "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}[fmt])
    expected = (FRAMES - 1) * FRAME_S
    tol = 0.08 if fmt in ("mp3", "aac") else 0.002  # encoder priming/padding
    assert abs(duration(r.content, fmt) - expected) < tol
    # the rate the audio is encoded at, also when the request did not ask for one
    assert r.headers["x-sample-rate"] == {"pcm": "24000", "opus": "48000"}.get(fmt, "44100")


def test_sample_rate_and_speed(server):
    r = speech(server, response_format="wav", sample_rate=16000, speed=2.0)
    audio, rate = sf.read(io.BytesIO(r.content))
    assert rate == 16000 and abs(len(audio) / rate - (FRAMES - 1) * FRAME_S / 2) < 0.002
    assert speech(server, response_format="opus", sample_rate=22050).status_code == 400  # opus rates only


def test_same_seed_same_audio(server):
    a, b = speech(server, response_format="pcm", seed=7), speech(server, response_format="pcm", seed=7)
    assert a.content == b.content and a.headers["x-seed"] == "7"


def test_audio_streams_as_it_is_made(server):
    arrivals, total = [], 0
    t0 = time.perf_counter()
    with httpx.stream("POST", server + "/v1/audio/speech", timeout=120,
                      json={"input": "A longer sentence to stream.", "response_format": "pcm", "max_new_tokens": 200,
                            "seed": 2}) as r:
        for chunk in r.iter_raw():
            arrivals.append(time.perf_counter() - t0)
            total += len(chunk)
    assert len(arrivals) > 5
    assert arrivals[0] < 0.5 * arrivals[-1]  # first audio long before the end
    assert total % 2 == 0  # whole 16-bit samples


def test_sse(server):
    r = speech(server, response_format="wav", stream_format="sse")
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "speech.audio.done" and events[-1]["usage"]["output_frames"] == FRAMES - 1
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert abs(duration(audio, "wav") - (FRAMES - 1) * FRAME_S) < 0.002


def test_no_audio_is_a_422_in_every_mode(server):
    # max_new_tokens 1 makes one frame, which a text chunk always drops: the generation ends with no audio.
    # An empty 200 would look like success; whole, streamed and SSE answers are a JSON 422 (the headers wait for
    # the first audio)
    for streaming in (False, True):
        r = httpx.post(server + "/v1/tts", timeout=60, json={"text": "Nothing.", "max_new_tokens": 1,
                                                              "streaming": streaming, "format": "wav"})
        assert r.status_code == 422, (streaming, r.status_code, r.content[:80])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "produced no audio" in err["message"], err
    r = speech(server, response_format="pcm", max_new_tokens=1)
    assert r.status_code == 422 and "produced no audio" in r.json()["error"]["message"]
    r = speech(server, response_format="wav", stream_format="sse", max_new_tokens=1)
    assert r.status_code == 422 and "produced no audio" in r.json()["error"]["message"], r.text
    assert speech(server, response_format="pcm", max_new_tokens=2).status_code == 200  # one frame is audio


def test_odd_unknown_field_names_are_percent_encoded_in_the_header(server):
    # a body's keys may hold any character; the header takes visible ASCII only (a raw CR LF or a non-Latin-1
    # name made the response fail with a 500 while the generation ran on for nobody)
    for streamed in (True, False):
        r = speech(server, response_format="pcm", max_new_tokens=4, stream=streamed,
                   **{"日本": 1, "a\r\nX-Evil: 1": 2, "b,c": 3})
        assert r.status_code == 200, r.text
        assert r.headers["x-ignored-fields"] == "%E6%97%A5%E6%9C%AC,a%0D%0AX-Evil%3A%201,b%2Cc"
        assert "x-evil" not in r.headers


def test_fish_tts_json_and_msgpack(server):
    ref = wav_bytes()
    r = httpx.post(server + "/v1/tts", timeout=120, json={
        "text": "Hi from fish.", "format": "wav", "seed": 1, "max_new_tokens": FRAMES,
        "references": [{"audio": base64.b64encode(ref).decode(), "text": "noise"}]})
    assert r.status_code == 200, r.text
    assert abs(duration(r.content, "wav") - (FRAMES - 1) * FRAME_S) < 0.002
    r = httpx.post(server + "/v1/tts", timeout=120, headers={"content-type": "application/msgpack"},
                   content=msgpack.packb({"text": "Hi again.", "format": "mp3", "streaming": True, "max_new_tokens": 10,
                                          "seed": 2,  # (a random seed may stop the tiny model before 9 frames)
                                          "chunk_length": 5000, "references": [{"audio": ref, "text": "noise"}]}))
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    assert abs(duration(r.content, "mp3") - 9 * FRAME_S) < 0.08


def test_voices_round_trip(server):
    ref = wav_bytes(seed=3)
    r = httpx.post(server + "/v1/references/add", data={"id": "alice", "text": "hello alice"},
                   files={"audio": ("a.wav", ref, "audio/wav")})
    assert r.status_code == 201 and r.json()["reference_id"] == "alice"
    assert httpx.post(server + "/v1/references/add", data={"id": "alice", "text": "x"},
                      files={"audio": ("a.wav", ref, "audio/wav")}).status_code == 409
    assert "alice" in httpx.get(server + "/v1/references/list").json()["reference_ids"]
    voices = httpx.get(server + "/v1/voices").json()["voices"]
    assert {"default", "alice"} <= {v["id"] for v in voices}
    assert speech(server, voice="alice").status_code == 200
    r = httpx.post(server + "/v1/tts", json={"text": "Fish with a stored voice.", "reference_id": "alice",
                                             "max_new_tokens": 8}, timeout=120)
    assert r.status_code == 200
    assert httpx.request("DELETE", server + "/v1/references/delete", json={"reference_id": "alice"}).status_code == 200
    assert httpx.request("DELETE", server + "/v1/references/delete?reference_id=alice").status_code == 404
    bad = speech(server, voice="alice")
    assert bad.status_code == 400 and "available: default" in bad.json()["error"]["message"]


def test_a_damaged_voice_fails_alone(tmp_path):
    # a voice whose files were damaged on disk: the list still answers (the voice flagged), using it is a clear
    # 400, and a good voice beside it works
    broken = tmp_path / "data" / "voices" / "broken"
    broken.mkdir(parents=True)
    (broken / "text.txt").write_bytes(b"\xff\xfe not utf-8 \xfa")
    (broken / "codes.npy").write_bytes(b"not a numpy file")
    (broken / "meta.json").write_text("{")
    proc, url = start_server(tmp_path)
    try:
        wait_ready(url, proc)
        ok = httpx.post(url + "/v1/references/add", data={"id": "fine", "text": "fine words"},
                        files={"audio": ("a.wav", wav_bytes(seed=5), "audio/wav")})
        assert ok.status_code == 201, ok.text
        listed = {v["id"]: v for v in httpx.get(url + "/v1/voices").json()["voices"]}
        assert "damaged" in listed["broken"]["error"] and "error" not in listed["fine"]
        bad = speech(url, voice="broken")
        assert bad.status_code == 400 and "voice 'broken' is damaged" in bad.json()["error"]["message"]
        assert speech(url, voice="fine").status_code == 200
    finally:
        stop(proc)


def test_an_unusable_data_dir_disables_voices_only(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the data directory should be")
    proc, url = start_server(tmp_path, TTS_DATA_DIR=str(blocker / "data"))
    try:
        wait_ready(url, proc)  # ready: synthesis is served
        assert speech(url).status_code == 200
        r = httpx.get(url + "/v1/voices")
        assert r.status_code == 503 and "stored voices are disabled" in r.json()["error"]["message"]
    finally:
        stop(proc)


@pytest.mark.parametrize("voice_id", ["../x", "a/b", "..", ".hidden", "x" * 65, " lead", "a\x00b", "default"])
def test_bad_voice_ids(server, voice_id):
    r = httpx.post(server + "/v1/references/add", data={"id": voice_id, "text": "t"},
                   files={"audio": ("a.wav", wav_bytes(), "audio/wav")})
    assert r.status_code == 400, (voice_id, r.text)
    assert httpx.get(server + "/v1/references/list").json()["reference_ids"] == []


def test_upload_limits_and_bad_audio(server):
    big = wav_bytes(seconds=8, rate=44100)  # > TTS_MAX_UPLOAD_BYTES of this server (300 kB)
    r = httpx.post(server + "/v1/references/add", data={"id": "big", "text": "t"}, files={"audio": ("b.wav", big)})
    assert r.status_code == 413
    r = httpx.post(server + "/v1/references/add", data={"id": "junk", "text": "t"},
                   files={"audio": ("j.wav", b"not audio" * 100)})
    assert r.status_code == 400 and "cannot decode" in r.json()["error"]["message"]
    assert "junk" not in httpx.get(server + "/v1/references/list").json()["reference_ids"]


def silence_flac(seconds: int, rate: int = 44100, hide_length: bool = False) -> bytes:
    """A decompression bomb: minutes of silence in a few hundred kB of FLAC (written 10 s at a time).
    hide_length: STREAMINFO's total samples set to 0 (unknown), so only decoding finds the length."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, 1, format="FLAC") as f:
        for _ in range(seconds // 10):
            f.write(np.zeros(rate * 10, np.float32))
    data = bytearray(buf.getvalue())
    if hide_length:
        data[21] &= 0xF0
        data[22:26] = bytes(4)
    return bytes(data)


@pytest.mark.parametrize("hide_length, words", [
    (False, "references[0].audio: 1200.0 s is longer than the limit of 60 s"),
    (True, "is longer than the limit of 60 s (decoding stopped at"),
])
def test_a_decompression_bomb_is_a_400_and_the_server_lives(server, hide_length, words):
    bomb = silence_flac(1200, hide_length=hide_length)  # 20 minutes, 212 MB as float32
    assert len(bomb) < 300_000  # under this server's upload limit
    r = httpx.post(server + "/v1/references/add", data={"id": "bomb", "text": "t"}, timeout=60,
                   files={"audio": ("b.flac", bomb, "audio/flac")})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "longer than the limit of 60 s" in error["message"] and "\n" not in error["message"], error
    assert "bomb" not in httpx.get(server + "/v1/references/list").json()["reference_ids"]
    r = httpx.post(server + "/v1/tts", timeout=60, json={
        "text": "hi", "references": [{"audio": base64.b64encode(bomb).decode(), "text": "t"}]})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and set(r.json()["error"]) >= {"message", "type"}
    assert httpx.get(server + "/health").json()["status"] == "ok"
    assert speech(server, response_format="pcm").status_code == 200


@pytest.mark.parametrize("send, status, words", [
    (dict(json={"input": ""}), 400, "text is empty"),
    (dict(json={"input": "x" * 1_000_000}), 400, "text has 1000000 characters; the limit is 20000"),
    (dict(json={"input": "x" * 3_000_000}), 413, "request body over 2000000 bytes"),
    (dict(json={"input": "hi", "voice": "nobody"}), 400, "unknown voice 'nobody'; available: default"),
    (dict(json={"input": "hi", "speed": 9}), 400, "speed"),
    (dict(json={"input": "hi", "response_format": "ogg"}), 400, "response_format"),
    (dict(json={"input": "hi", "temperature": 5}), 400, "temperature=5.0 is outside"),
    (dict(json={"input": "hi", "bogus": 1, "speed": 9}), 400, "speed"),  # unknown fields: test_http_dropin
    (dict(content=b"{bad", headers={"content-type": "application/json"}), 400, "not valid JSON"),
    (dict(json=["a list"]), 400, "body"),
])
def test_bad_openai_requests(server, send, status, words):
    r = httpx.post(server + "/v1/audio/speech", timeout=60, **send)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


@pytest.mark.parametrize("send, status, words", [
    (dict(content=b"text", headers={"content-type": "text/plain"}), 415, "unsupported content type"),
    (dict(content=b"\xc1\xff\x00", headers={"content-type": "application/msgpack"}), 400, "not valid msgpack"),
    (dict(content=b"{bad", headers={"content-type": "application/json"}), 400, "not valid JSON"),
    (dict(json={"text": "hi", "references": [{"audio": "%%%not-base64", "text": ""}]}), 400, "not valid base64"),
    (dict(json={"text": "hi", "reference_id": "../etc"}), 400, "invalid voice id"),
    (dict(json={"text": "hi", "format": "wma"}), 400, "format"),
    (dict(json={"text": "hi", "top_p": 0}), 400, "top_p=0.0 is outside"),
])
def test_bad_fish_requests(server, send, status, words):
    r = httpx.post(server + "/v1/tts", timeout=60, **send)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


def scrape(url: str) -> list[Sample]:
    """Every sample of one /metrics scrape, parsed (label order and number formatting are the library's)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def test_disconnect_mid_stream_frees_the_engine(server):
    cancelled = _metric(server, "tts_requests_cancelled_total")
    # seed 1 with this text runs past 600 frames on the tiny model (no early <|im_end|>), so it is
    # certainly still generating when the client leaves
    with httpx.stream("POST", server + "/v1/audio/speech", timeout=120,
                      json={"input": "Long.", "response_format": "pcm", "max_new_tokens": 3000, "seed": 1}) as r:
        chunks = r.iter_raw()  # keep it referenced: a dropped iterator closes the connection
        next(chunks)  # generation is under way
        assert _metric(server, "tts_active_streams") == 1
    end = time.time() + 10
    while time.time() < end and (_metric(server, "tts_active_streams") or
                                 _metric(server, "tts_requests_cancelled_total") == cancelled):
        time.sleep(0.05)
    assert _metric(server, "tts_active_streams") == 0
    assert _metric(server, "tts_requests_cancelled_total") == cancelled + 1


def test_metrics_and_health(server):
    # one 200 and one 400 on the speech route, counted below whatever ran before
    assert speech(server, response_format="exe").status_code == 400
    assert speech(server, response_format="pcm", max_new_tokens=4).status_code == 200
    assert httpx.get(server + "/health").json()["status"] == "ok"
    assert httpx.get(server + "/v1/health").json()["status"] == "ok"  # fish-speech's route
    ready = httpx.get(server + "/ready").json()
    assert ready["status"] == "ready"
    # the server's engine runs on the CPU: the cpu preset, with TTS_MAX_BATCH's override applied
    assert ready["memory_preset"]["name"] == "cpu" and ready["memory_preset"]["max_batch"] == ready["max_streams"]
    assert ready["kv_positions"] > 0
    text = httpx.get(server + "/metrics").text
    for name in ("tts_http_requests_total{", "tts_http_errors_total{", "tts_queue_depth", "tts_active_streams",
                 "tts_frames_per_second", "tts_time_to_first_audio_seconds_bucket", "tts_engine_info{"):
        assert name in text
    assert 'memory_preset="cpu"' in text
    assert _metric(server, "tts_max_streams") == ready["max_streams"]
    assert _metric(server, "tts_kv_cache_positions") == ready["kv_positions"]
    requests = [x.labels for x in scrape(server) if x.name == "tts_http_requests_total"]
    assert {"method": "POST", "route": "/v1/audio/speech", "code": "200"} in requests
    assert any(labels["code"] == "400" for labels in requests)
    # the body limit's refusals are counted too (it sits inside the metrics middleware)
    big = httpx.post(server + "/v1/tts", content=b"x" * 2_000_001, headers={"content-type": "application/json"})
    assert big.status_code == 413
    assert {"method": "POST", "route": "unmatched", "code": "413"} in [
        x.labels for x in scrape(server) if x.name == "tts_http_requests_total"]
    # a method outside the usual seven is "other" (h11 takes any token: each would be a new series)
    httpx.request("PROPFIND", server + "/health")
    methods = {x.labels["method"] for x in scrape(server) if x.name == "tts_http_requests_total"}
    assert "other" in methods and "PROPFIND" not in methods, methods


def test_health_and_ready_keep_their_keys(server):
    """The JSON of /health and /ready, key by key and in order, as it was when the engines' stats were dicts, plus
    graphs_pending (issue 44: what a settled /ready waits for), added last, and the model served (issue 47)."""
    engine_keys = ["index", "device", "codec_device", "state", "error", "running", "waiting", "max_streams",
                   "graphs_pending"]
    health = httpx.get(server + "/health").json()
    assert list(health) == ["status", "engines"] and [list(e) for e in health["engines"]] == [engine_keys]
    ready = httpx.get(server + "/ready").json()
    assert list(ready) == ["status", "model", "warmup_seconds", "quantization", "kernel_cache", "memory_preset",
                           "max_streams", "kv_positions", "graphs_pending", "engines"]
    assert ready["model"] == {"dir": str(MODEL_DIR), "source": None}  # the test checkpoint has no fetch record
    assert list(ready["memory_preset"]) == ["name", "max_batch", "positions_per_stream", "memory_utilization"]
    assert [list(e) for e in ready["engines"]] == [engine_keys] and ready["engines"] == health["engines"]
    assert isinstance(ready["warmup_seconds"], float) and ready["quantization"] == "bf16 (none)"
    assert ready["kernel_cache"] == "off" and isinstance(ready["kv_positions"], int)
    assert health["engines"][0] | {"running": 0, "waiting": 0} == {
        "index": 0, "device": "cpu", "codec_device": "cpu", "state": "ready", "error": None, "running": 0,
        "waiting": 0, "max_streams": ready["max_streams"], "graphs_pending": 0}


def test_head_answers_like_get_without_a_body(server):
    for path in ("/health", "/ready", "/metrics", "/"):
        get, head = httpx.get(server + path), httpx.head(server + path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
    assert httpx.head(server + "/health").headers["content-length"] == str(len(httpx.get(server + "/health").content))
    assert httpx.head(server + "/v1/audio/speech").status_code == 405  # POST-only routes stay POST-only


def test_a_port_in_use_is_a_one_line_error(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "handlers", "http", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=ROOT, env={**os.environ, "TTS_MODEL_DIR": str(MODEL_DIR), "TTS_DEVICE": "cpu"},
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"handlers http: port {port} on 127.0.0.1 is already in use (set TTS_PORT or --port)"


def test_a_blank_api_key_is_a_start_up_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "handlers", "http"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TTS_MODEL_DIR": str(MODEL_DIR), "TTS_API_KEY": "   "}, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("handlers http: environment variable TTS_API_KEY is blank (whitespace only): "
                                   "unset it or give a value")


def test_web_page_is_served(server):
    r = httpx.get(server + "/")
    assert r.status_code == 200 and "<textarea" in r.text and "/v1/audio/speech" in r.text


def test_schemathesis_finds_no_server_errors_and_only_documented_statuses(server):
    schema = httpx.get(server + "/openapi.json").json()
    speech_responses = schema["paths"]["/v1/audio/speech"]["post"]["responses"]
    assert {"400", "413", "415", "422", "503"} <= set(speech_responses)  # 422 is "no audio", not FastAPI's
    assert speech_responses["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    exe = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    proc = subprocess.run([exe, "run", server + "/openapi.json", "--checks",
                           "not_a_server_error,status_code_conformance",
                           "--max-examples", "8", "--generation-deterministic", "--request-timeout", "120"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_api_key(tmp_path):
    proc, url = start_server(tmp_path, TTS_API_KEY="s3cret")
    try:
        wait_ready(url, proc)
        assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/metrics").status_code == 200
        r = speech(url)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert speech(url).json()["error"]["type"] == "authentication_error"
        assert httpx.get(url + "/v1/voices", headers={"Authorization": "Bearer nope"}).status_code == 401
        # the key is checked before the body is read: an invalid body, a wrong content type or an upload without
        # the key is a 401, never a 400/415 that would say the server looked at it
        for body, ctype in ((b'{"input": ', "application/json"), (b"x", "text/plain")):
            r = httpx.post(url + "/v1/audio/speech", content=body, headers={"content-type": ctype})
            assert r.status_code == 401, (ctype, r.text)
        r = httpx.post(url + "/v1/references/add", data={"id": "v", "text": "t"},
                       files={"audio": ("a.wav", wav_bytes(), "audio/wav")})
        assert r.status_code == 401 and not (tmp_path / "data" / "voices" / "v").exists()
        # described openly: the schema and its page hold no data
        assert httpx.get(url + "/openapi.json").status_code == 200 and httpx.get(url + "/docs").status_code == 200
        assert httpx.get(url + "/v1/models").status_code == 401
        ok = httpx.post(url + "/v1/audio/speech", headers={"Authorization": "Bearer s3cret"}, timeout=120,
                        json={"input": "Authorised.", "response_format": "wav"})
        assert ok.status_code == 200
        assert httpx.get(url + "/v1/voices", headers={"X-API-Key": "s3cret"}).status_code == 200
    finally:
        stop(proc)


def test_missing_model_dir_is_one_line_at_start(tmp_path):
    """No model: `python -m handlers http` exits at once with one line naming what is missing (issue 47)."""
    for model in (tmp_path / "nowhere", tmp_path):
        proc, _ = start_server(tmp_path, TTS_MODEL_DIR=str(model))
        assert proc.wait(timeout=60) == 2
        text = server_log(proc).strip()
        assert "Traceback" not in text and text.count("\n") == 0, text
        assert "missing: config.json" in text and "TTS_MODEL_SOURCE=tiny" in text


def test_broken_model_dir_reports_on_ready_and_health(tmp_path):
    """A complete-looking dir whose weights cannot load: the server stays up and says why on /ready."""
    model = complete_model(tmp_path / "model")
    (model / "model.pth").write_bytes(b"not a checkpoint")
    proc, url = start_server(tmp_path, TTS_MODEL_DIR=str(model))
    try:
        end = time.time() + 60
        while time.time() < end:
            try:
                if httpx.get(url + "/ready", timeout=2).json().get("status") == "failed":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = httpx.get(url + "/ready")
        assert r.status_code == 503 and "model.pth" in r.json()["error"], r.text
        assert httpx.get(url + "/health").status_code == 500
        assert speech(url).status_code == 503
    finally:
        stop(proc)


def test_tiny_source_serves_short_answers_without_max_new_tokens(tmp_path):
    """TTS_MODEL_SOURCE=tiny fetches the test model into TTS_MODEL_DIR; with TTS_DEFAULT_MAX_NEW_TOKENS unset a
    request without max_new_tokens makes TINY_MAX_NEW_TOKENS frames, not 1024 frames of noise."""
    from ttsengine.serving.download import TINY_MAX_NEW_TOKENS

    proc, url = start_server(tmp_path, TTS_MODEL_DIR=str(tmp_path / "models" / "current"), TTS_MODEL_SOURCE="tiny",
                             TTS_DEFAULT_MAX_NEW_TOKENS="0")  # 0: auto, as when unset
    try:
        wait_ready(url, proc)

        def pcm(**extra):
            r = httpx.post(url + "/v1/audio/speech", timeout=120,
                           json={"input": "Hello.", "response_format": "pcm", "seed": 1, **extra})
            assert r.status_code == 200, r.text
            return len(r.content)

        assert 0 < pcm() <= pcm(max_new_tokens=TINY_MAX_NEW_TOKENS) < pcm(max_new_tokens=4 * TINY_MAX_NEW_TOKENS)
        model = httpx.get(url + "/ready").json()["model"]  # which model is served, from the fetch's record
        assert model["dir"] == str(tmp_path / "models" / "current") and model["source"] == "tiny", model
        assert set(model) == {"dir", "source", "fetched_at"}, model
    finally:
        stop(proc)


def test_ready_is_503_until_the_engine_is_warm(tmp_path):
    """In-process uvicorn with the real engine behind a gate, to see the loading state for sure."""
    import uvicorn

    from handlers.http.app import create_app
    from ttsengine import EngineConfig, Fleet, ServerConfig

    gate = threading.Event()

    def factory():
        gate.wait(30)
        return Fleet.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2))

    port = free_port()
    app = create_app(ServerConfig(port=port, data_dir=tmp_path), EngineConfig(), engine_factory=factory)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 20
        while time.time() < end:
            try:
                r = httpx.get(url + "/ready", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert httpx.get(url + "/health").status_code == 200
        assert speech(url).status_code == 503
        gate.set()
        wait_ready(url, None)
        assert speech(url, response_format="wav").status_code == 200
    finally:
        srv.should_exit = True
        thread.join(timeout=20)
        app.state.service.close()


def test_bad_server_config_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "handlers", "http"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TTS_PORT": "99999"}, timeout=60)
    assert proc.returncode == 2 and "TTS_PORT" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "handlers", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: python -m handlers" in proc.stderr


def test_loadtest_against_the_server(server, tmp_path):
    out = tmp_path / "lt"
    proc = subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", server, "--concurrency", "1,2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "loadtest.json").read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    assert all(lv["errors"] == 0 and lv["requests"] == 2 * lv["concurrency"] for lv in report["levels"])
    assert all(lv["audio_s_per_s"] > 0 and lv["first_audio_p50_ms"] > 0 for lv in report["levels"])
    assert (out / "loadtest.html").stat().st_size > 10_000
    assert "first_audio_p95_ms" in proc.stdout
    assert f"wrote {out / 'loadtest.json'} and {out / 'loadtest.html'}" in proc.stdout


@pytest.mark.parametrize("raw, words", [
    (b"[" * 100_000, "body is nested too deeply"),
    (b'{"text": "hi", "seed": ' + b"9" * 5000 + b"}", "integer with too many digits"),
    (b'{"reference_id": ' + b"1" * 4400 + b"}", "integer with too many digits"),
])
def test_hostile_json_is_a_400_not_a_traceback(server, raw, words):
    for method, path in [("POST", "/v1/tts"), ("DELETE", "/v1/references/delete")]:
        r = httpx.request(method, server + path, content=raw, headers={"content-type": "application/json"},
                          timeout=60)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert words in r.json()["error"]["message"] and "Traceback" not in r.text
    assert httpx.get(server + "/health").json()["status"] == "ok"


@pytest.mark.parametrize("audio", [b"RIFF\x00\x00\x00\x00WAVEfmt ", b"fLaC" + bytes(40), b"OggS" + bytes(40),
                                   b"garbage" * 10])
def test_error_messages_carry_no_object_reprs(server, audio):
    # libsndfile says "Error opening <_io.BytesIO object at 0x7f...>": no heap address reaches a client
    r = httpx.post(server + "/v1/tts", timeout=60, headers={"content-type": "application/msgpack"},
                   content=msgpack.packb({"text": "x", "references": [{"audio": audio, "text": "t"}]}))
    assert r.status_code == 400 and "cannot decode" in r.text, r.text
    r2 = httpx.post(server + "/v1/references/add", data={"id": "reprs", "text": "t"},
                    files={"audio": ("a.wav", audio, "audio/wav")}, timeout=60)
    r3 = httpx.request("DELETE", server + "/v1/references/delete", headers={"content-type": "application/msgpack"},
                       content=msgpack.packb({"reference_id": msgpack.ExtType(3, b"a")}), timeout=60)
    assert r2.status_code == 400 and r3.status_code == 400 and "is a string, not ExtType" in r3.text, r3.text
    for resp in (r, r2, r3):
        assert not re.search(r"0x[0-9a-fA-F]{4,}| object at |ExtType\(", resp.text), resp.text


def captioned_audio_seconds(url: str) -> float:
    """tts_speech_audio_seconds_total of the captioned route's ok requests, all label sets."""
    return sum(x.value for x in scrape(url) if x.name == "tts_speech_audio_seconds_total"
               and x.labels.get("route") == "/v1/audio/speech/captioned" and x.labels.get("status") == "ok")


def test_captioned_speech(server):
    before = captioned_audio_seconds(server)
    sentence = "This sentence is one of several that make the text long enough for three chunks of speech."
    r = httpx.post(server + "/v1/audio/speech/captioned", timeout=120,
                   json={"input": " ".join([sentence] * 6), "response_format": "wav", "seed": 3, "speed": 1.25})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    body = r.json()
    audio, rate = sf.read(io.BytesIO(base64.b64decode(body["audio"])))
    assert rate == body["sample_rate"] and abs(len(audio) / rate - body["seconds"]) < 0.002
    cues = body["captions"]
    assert len(cues) == 3 and cues[0]["start"] == 0 and all(c["text"] == f"{sentence} {sentence}" for c in cues)
    assert all(a["end"] == b["start"] for a, b in zip(cues, cues[1:]))
    assert abs(cues[-1]["end"] - body["seconds"]) < 0.002  # speed 1.25: the times are the audio's, not the model's
    assert body["srt"].startswith("1\n00:00:00,000 --> ") and body["vtt"].startswith("WEBVTT\n\n00:00:00.000 --> ")
    assert body["seed"] == 3 and r.headers["x-seed"] == "3"
    sse = httpx.post(server + "/v1/audio/speech/captioned", json={"input": "x", "stream_format": "sse"})
    assert sse.status_code == 400 and "not SSE" in sse.json()["error"]["message"]
    # in the speech histograms under its own route, with the audio it made
    assert abs(captioned_audio_seconds(server) - before - body["seconds"]) < 0.01
