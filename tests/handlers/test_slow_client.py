"""A client that stops sending its request body gets 408 after TTS_READ_TIMEOUT and its connection is closed,
on the real servers; the server goes on serving others meanwhile."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest
from test_drain import start_serve


def stalled_post(url: str, path: str) -> tuple[float, bytes]:
    """Sends headers promising 1,000 bytes and only 10 of them; -> (seconds until the answer, the answer)."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 1000\r\n\r\n".encode() + b'{"input": ')
        t0 = time.perf_counter()
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 10:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return time.perf_counter() - t0, data


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    proc, url = start_serve(tmp_path_factory.mktemp("slow"), TTS_READ_TIMEOUT="1.5")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def test_serve_answers_a_stalled_body_with_408(serve):
    seconds, answer = stalled_post(serve, "/invocations")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert json.loads(body)["error"] == {"message": "the request body stalled for 1.5 s", "code": 408}
    assert 1.4 < seconds < 10
    assert httpx.get(serve + "/ping").status_code == 200


def test_http_answers_a_stalled_body_with_408(tmp_path):
    from test_http import start_server, stop, wait_ready

    proc, url = start_server(tmp_path, TTS_READ_TIMEOUT="1.5")
    try:
        wait_ready(url, proc)
        seconds, answer = stalled_post(url, "/v1/audio/speech")
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        assert json.loads(body)["error"]["message"] == "the request body stalled for 1.5 s"
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        assert 1.4 < seconds < 10
        assert httpx.get(url + "/ready").status_code == 200
    finally:
        stop(proc)
