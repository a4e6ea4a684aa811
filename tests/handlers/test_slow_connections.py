"""Slow clients that pause too little for TTS_READ_TIMEOUT to see them (issue 50 item 11), against the real
server over raw sockets: headers sent a byte at a time (TTS_HEADER_TIMEOUT), a body sent at 200 B/s
(TTS_BODY_MIN_RATE after TTS_BODY_RATE_GRACE), sockets that never send a byte (TTS_IDLE_TIMEOUT). Each is cut
within its bound while a normal request, and a slow but reasonable upload, are still served. The deadlines are
short here so that each test takes a few seconds."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest
from test_drain import start_serve
from test_http import server_log, start_server, stop, wait_ready

IDLE, HEADER, GRACE, MIN_RATE = 1.0, 2.0, 1.0, 1024
DEADLINES = {"TTS_IDLE_TIMEOUT": str(IDLE), "TTS_HEADER_TIMEOUT": str(HEADER), "TTS_BODY_RATE_GRACE": str(GRACE),
             "TTS_BODY_MIN_RATE": str(MIN_RATE), "TTS_READ_TIMEOUT": "30"}  # pauses are short: not what cuts here
SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("slow"), **DEADLINES)
    try:
        wait_ready(url, proc)
        yield url
    finally:
        stop(proc)


def connect(url: str) -> socket.socket:
    u = urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=30)


def trickle(s: socket.socket, data: bytes, piece: int, every: float, give_up: float) -> tuple[float, bytes]:
    """Sends `data` `piece` bytes every `every` seconds until the server answers or closes (or `give_up` seconds
    pass) -> (seconds from the first byte to the first byte back or the close, what came back)."""
    t0 = time.perf_counter()
    for i in range(0, len(data), piece):
        try:
            s.sendall(data[i:i + piece])
        except OSError:  # closed under us: what it sent (if anything) is still to read
            break
        if select.select([s], [], [], every)[0] or time.perf_counter() - t0 > give_up:
            break
    return time.perf_counter() - t0, read_answer(s, give_up)


def read_answer(s: socket.socket, timeout: float) -> bytes:
    """All the server sends until it closes (a reset after a 408 ends it too)."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return got


def json_of(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_header_deadline(server):
    request = b"GET /ready HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with connect(server) as s:
        seconds, answer = trickle(s, request, 1, 0.5, give_up=10)
    assert HEADER - 0.2 < seconds < HEADER + 1.5, seconds
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]  # 408 unless the close reset it


def test_headers_that_stop_half_way_get_a_json_408(server):
    with connect(server) as s:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Ty")
        t0 = time.perf_counter()
        answer = read_answer(s, 10)
    assert HEADER - 0.2 < time.perf_counter() - t0 < HEADER + 1.5
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json_of(answer)["error"] == {"message": f"the request headers took longer than {HEADER:g} s",
                                        "type": "invalid_request_error", "code": 408}


def test_a_body_at_200_bytes_a_second_gets_408(server):
    body = json.dumps({"input": "Hi.", "pad": "x" * 20_000}).encode()
    head = (f"POST {SPEECH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with connect(server) as s:
        s.sendall(head)
        seconds, answer = trickle(s, body, 100, 0.5, give_up=15)  # 200 B/s, no pause near TTS_READ_TIMEOUT
    assert GRACE - 0.2 < seconds < GRACE + 2, seconds
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    if answer:
        message = json_of(answer)["error"]["message"]
        assert message.startswith("the request body arrived at ") and f"under {MIN_RATE} bytes/s" in message


def test_idle_sockets_are_closed_while_a_normal_request_is_served(server):
    sockets = [connect(server) for _ in range(150)]
    try:
        t0 = time.perf_counter()
        r = httpx.post(server + SPEECH, json={"input": "Hello.", "response_format": "wav"}, timeout=30)
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        closed_after = []
        for s in sockets:
            s.settimeout(max(0.1, IDLE + 3 - (time.perf_counter() - t0)))
            try:
                closed = s.recv(1) == b""
            except (TimeoutError, ConnectionResetError) as e:
                closed = isinstance(e, ConnectionResetError)
            assert closed, f"socket open after {time.perf_counter() - t0:.1f} s"
            closed_after.append(time.perf_counter() - t0)
        assert IDLE - 0.2 < min(closed_after) and max(closed_after) < IDLE + 3, (min(closed_after), max(closed_after))
    finally:
        for s in sockets:
            s.close()


def test_a_slow_but_reasonable_upload_succeeds(server):
    """64 KB at about 50 KB/s, longer than the rate's grace period: well over the minimum rate, so it is served."""
    body = json.dumps({"input": "Hello.", "response_format": "wav", "pad": "x" * 65_000}).encode()
    head = (f"POST {SPEECH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with connect(server) as s:
        s.sendall(head)
        t0 = time.perf_counter()
        for i in range(0, len(body), 1000):
            s.sendall(body[i:i + 1000])
            time.sleep(0.02)
        assert time.perf_counter() - t0 > GRACE
        answer = read_answer(s, 30)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b"RIFF" in answer


def test_a_keep_alive_connection_is_closed_after_the_idle_timeout(server):
    with connect(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.perf_counter()
        answer = read_answer(s, 10)  # the response, then the close
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer.lower()
    assert IDLE - 0.2 < time.perf_counter() - t0 < IDLE + 1.5


def test_serve_cuts_slow_headers_and_slow_bodies_too(tmp_path):
    """SageMaker's `serve` runs the same guards, with its own error layout."""
    proc, url = start_serve(tmp_path, **DEADLINES)
    try:
        with connect(url) as s:
            s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n")
            t0 = time.perf_counter()
            answer = read_answer(s, 10)
        assert HEADER - 0.2 < time.perf_counter() - t0 < HEADER + 1.5
        assert json_of(answer) == {"error": {"message": f"the request headers took longer than {HEADER:g} s",
                                             "code": 408}}
        with connect(url) as s:
            s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 20000\r\n\r\n")
            seconds, answer = trickle(s, b"x" * 20_000, 100, 0.5, give_up=15)
        assert GRACE - 0.2 < seconds < GRACE + 2, seconds
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert httpx.get(url + "/ping", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _until_answer(url: str, path: str, status: int, timeout: float = 20) -> httpx.Response:
    end = time.monotonic() + timeout
    while True:
        r = httpx.get(url + path, timeout=10)
        if r.status_code == status or time.monotonic() > end:
            return r
        time.sleep(0.05)


@pytest.mark.parametrize("adapter", ["http", "serve"])
def test_connections_past_the_cap_get_a_json_503_and_a_websocket_counts_until_it_closes(tmp_path, adapter):
    # issue 50: no cap on open connections let a flood take every file descriptor. TTS_MAX_CONNECTIONS=3: three idle
    # sockets held open (no idle timeout here), and the fourth connection is answered 503 before its request is read
    env = {"TTS_MAX_CONNECTIONS": "3", "TTS_IDLE_TIMEOUT": "0"}
    proc, url = start_serve(tmp_path, **env) if adapter == "serve" else start_server(tmp_path, **env)
    health = "/ping" if adapter == "serve" else "/health"
    try:
        if adapter == "http":
            wait_ready(url, proc)
        held = [connect(url) for _ in range(3)]
        r = _until_answer(url, health, 503)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        error = r.json()["error"]
        assert error["message"] == "the server has 3 connections open (TTS_MAX_CONNECTIONS=3); retry shortly"
        assert error["code"] == 503 and error.get("type", "server_busy") == "server_busy", error
        held.pop().close()  # one leaves: the next connection is served
        assert _until_answer(url, health, 200).status_code == 200
        if adapter == "http":  # a WebSocket is counted as long as it is open, after its upgrade too
            from websockets.sync.client import connect as ws_connect

            with ws_connect(url.replace("http", "ws") + "/v1/tts/live"):
                assert _until_answer(url, health, 503).status_code == 503  # 2 held + the socket
            assert _until_answer(url, health, 200).status_code == 200
        for s in held:
            s.close()
    finally:
        stop(proc)
    log = (tmp_path / "serve.log").read_text() if adapter == "serve" else server_log(proc)
    assert "refused a connection from" in log and "Traceback" not in log
