"""Issue 50 through the real server (`python -m handlers http`, the tiny model on CPU), with the engines in the
server's process and in their own (TTS_ENGINE_PROCESS): a burst onto idle slots is taken whole; references whose
header hides their length, and too many references, are a 400 before any is encoded; requests whose clients
left are given up (no reference encoded for nobody) and never hold up /health; goodput admission (TTS_ADMIT_RTF)
answers 503 when the measured step says the streams would fall below real time."""

from __future__ import annotations

import base64
import io
import json
import socket
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_http import _metric, served, silence_flac

LONG = {"input": "Long.", "response_format": "pcm", "max_new_tokens": 3000, "seed": 1}  # ~1000 frames, 25 s+


def until(condition, timeout: float = 60, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def raw_post(url: str, body: dict, path: str = "/v1/audio/speech") -> socket.socket:
    """A request on a raw socket whose answer is read only by answer(); closing the socket leaves."""
    data = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return sock


def status_line(sock: socket.socket) -> bytes:
    """What the server sent so far, up to the status line (b"" while nothing came)."""
    sock.setblocking(False)
    try:
        return sock.recv(64, socket.MSG_PEEK).split(b"\r\n")[0]
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


@pytest.mark.parametrize("process", ["off", "on"])
def test_a_burst_onto_idle_slots_is_taken_whole(tmp_path, process):  # a server of its own: 8 slots, 8 places
    # 16 requests at once onto 8 idle slots and 8 queue places: every one taken in (8 running, 8 waiting), none
    # refused; the 17th is the first 503
    with served(tmp_path, TTS_ENGINE_PROCESS=process, TTS_MAX_BATCH="8", TTS_MAX_QUEUE="8") as url:
        rejected = _metric(url, "tts_requests_rejected_total")
        socks = [raw_post(url, LONG) for _ in range(16)]
        try:
            until(lambda: _metric(url, "tts_active_streams") + _metric(url, "tts_queue_depth") == 16
                  or any(status_line(s).startswith(b"HTTP/1.1 503") for s in socks), what="16 taken in")
            assert [status_line(s) for s in socks if status_line(s).startswith(b"HTTP/1.1 5")] == []
            assert _metric(url, "tts_requests_rejected_total") == rejected
            r = httpx.post(url + "/v1/audio/speech", json=LONG, timeout=60)
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_busy", r.text
        finally:
            for s in socks:
                s.close()
        until(lambda: _metric(url, "tts_active_streams") + _metric(url, "tts_queue_depth") == 0, what="all gone")


@pytest.mark.parametrize("process", ["off", "on"])
def test_goodput_admission_answers_503_when_streams_would_fall_below_real_time(tmp_path, process):
    # TTS_ADMIT_RTF=100: a step must take under 0.46 ms, which no CPU step does. A long stream runs (an idle engine
    # refuses nothing: no stream to protect); once its steps are timed, the next request is a 503 with Retry-After
    # that says why, counted in tts_requests_refused_capacity_total, although 3 of 4 slots are free
    short = {"input": "Hi.", "response_format": "pcm", "max_new_tokens": 8, "seed": 1}
    with served(tmp_path, TTS_ENGINE_PROCESS=process, TTS_MAX_BATCH="4", TTS_ADMIT_RTF="100") as url:
        playing = raw_post(url, LONG)
        try:
            until(lambda: _metric(url, "tts_active_streams") == 1 and _metric(url, "tts_frames_total") > 4,
                  what="the long stream decoding")
            r = httpx.post(url + "/v1/audio/speech", json=short, timeout=60)
            assert r.status_code == 503 and r.headers["retry-after"], r.text
            error = r.json()["error"]
            assert error["type"] == "server_busy" and error["message"].startswith(
                "the engine is at capacity: a step for 2 streams would take"), error
            assert "that keep each at 100x real time; retry shortly" in error["message"], error
            assert _metric(url, "tts_requests_refused_capacity_total") == 1
            assert status_line(playing).startswith(b"HTTP/1.1 200")  # the stream playing is not touched
        finally:
            playing.close()
        until(lambda: _metric(url, "tts_active_streams") == 0, what="the long stream gone")
        assert httpx.post(url + "/v1/audio/speech", json=short, timeout=60).status_code == 200  # idle: served


def click_flac(seconds: float, seed: int, rate: int = 16000) -> bytes:
    """A distinct reference per seed (the encoded-reference cache never serves one for another): quiet but for a
    click at a place of its own, so a long one is a few kB of FLAC and as slow to encode as any audio."""
    samples = np.zeros(int(seconds * rate), np.float32)
    samples[seed % len(samples)] = 0.5
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="FLAC")
    return buf.getvalue()


def with_references(*audio: bytes) -> dict:
    return {"text": "Hi.", "format": "pcm", "max_new_tokens": 8, "seed": 1,
            "references": [{"audio": base64.b64encode(a).decode(), "text": "ref"} for a in audio]}


@pytest.fixture(scope="module", params=["off", "on"])
def server(request, tmp_path_factory):
    with served(tmp_path_factory.mktemp("overload"), TTS_ENGINE_PROCESS=request.param,
                TTS_MAX_BODY_BYTES="3000000") as url:
        yield url


def test_references_of_unknown_length_and_too_many_are_a_400_before_any_is_encoded(server):
    encoded = _metric(server, "tts_references_encoded_total")
    hidden = silence_flac(50, hide_length=True)  # 50 s whose FLAC header says 0 samples: 1076 prompt tokens
    r = httpx.post(server + "/v1/tts", json=with_references(*[hidden] * 8), timeout=120)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("the references need at least ") and "use shorter or fewer references" in message
    r = httpx.post(server + "/v1/tts", json=with_references(*[click_flac(0.5, i) for i in range(9)]), timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "9 references; the limit is 8 (TTS_MAX_REFERENCES)"
    assert _metric(server, "tts_references_encoded_total") == encoded
    r = httpx.post(server + "/v1/tts", json=with_references(silence_flac(10, hide_length=True)), timeout=120)
    assert r.status_code == 200 and r.content, r.text  # one such reference that fits is measured and used
    assert _metric(server, "tts_references_encoded_total") == encoded + 1


def test_requests_whose_clients_left_are_given_up_and_health_never_waits(server):
    # 60 requests, each with a reference of its own (20 s: ~5 s of codec encoding on this CPU, two at a time): more
    # than any thread pool holds. /health answers at once while they wait (it took 12 s behind 45 such in the
    # hostile run); once their clients leave, the encodings already under way finish and nothing more is encoded
    # for nobody (before: all 60, 150 s of CPU after the clients had gone)
    encoded = _metric(server, "tts_references_encoded_total")
    socks = [raw_post(server, with_references(click_flac(20, 1000 + i)), path="/v1/tts") for i in range(60)]
    try:
        until(lambda: _metric(server, "tts_references_encoded_total") > encoded, what="the first reference encoded")
        for _ in range(3):
            t0 = time.monotonic()
            r = httpx.get(server + "/health", timeout=60)
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            assert time.monotonic() - t0 < 3, f"/health took {time.monotonic() - t0:.1f} s behind planning"
    finally:
        for s in socks:
            s.close()
    at_close = _metric(server, "tts_references_encoded_total")
    assert at_close - encoded < 30, "most of them should still have been waiting"
    final = settled(lambda: _metric(server, "tts_references_encoded_total"))
    # the two under way, and two more that started before the server saw the clients go (it asks every 0.25 s):
    # not the ~50 still waiting
    assert final <= at_close + 4, (encoded, at_close, final)
    r = httpx.post(server + "/v1/tts", json=with_references(click_flac(1, 7)), timeout=120)
    assert r.status_code == 200, r.text


def settled(read, quiet: float = 5.0, timeout: float = 90.0):
    """read()'s value once it has not changed for `quiet` seconds (a counter that stopped growing)."""
    end = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < end, f"still changing after {timeout:.0f} s: {value}"
        time.sleep(0.25)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value
