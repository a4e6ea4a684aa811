"""The connection guard around each of uvicorn's HTTP protocols (httptools, which the servers use, and h11, its
fallback): it reads only their `cycle`, so these pin that to the uvicorn installed. In-process uvicorn, a
stand-in app, raw sockets."""

from __future__ import annotations

import functools
import socket
import threading
import time

import pytest
import uvicorn
from conftest import free_port
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ttsengine.serving.network.connection_guard import ConnectionGuard, Deadlines

IDLE, HEADER = 0.5, 0.8


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module", params=[HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def port(request):
    port = free_port()
    http = functools.partial(ConnectionGuard, request.param, Deadlines(IDLE, HEADER))
    server = uvicorn.Server(uvicorn.Config(app, port=port, http=http, timeout_keep_alive=IDLE, lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(10)


def until_closed(s: socket.socket) -> tuple[float, bytes]:
    t0, got = time.perf_counter(), b""
    s.settimeout(5)
    while chunk := s.recv(65536):
        got += chunk
    return time.perf_counter() - t0, got


def test_a_socket_that_sends_nothing_is_closed_after_the_idle_timeout(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        seconds, got = until_closed(s)
    assert got == b"" and IDLE - 0.1 < seconds < IDLE + 1


def test_headers_that_stop_get_408_at_the_header_deadline(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        seconds, got = until_closed(s)
    assert got.startswith(b"HTTP/1.1 408") and b'"the request headers took longer than 0.8 s"' in got
    assert HEADER - 0.1 < seconds < HEADER + 1


def test_headers_in_time_are_served_and_the_next_request_is_timed_afresh(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[:-4]:
            s.sendall(bytes([byte]))
        time.sleep(HEADER / 2)
        s.sendall(b"\r\n\r\n")  # complete within the deadline
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        for _ in range(2):  # the second request lands past the first's header deadline: it was disarmed
            time.sleep(IDLE * 0.6)  # within the keep-alive
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")


def test_the_automatic_connection_cap_raises_the_soft_fd_limit_first():
    """TTS_MAX_CONNECTIONS=0 on a host that starts processes at a low soft limit: the soft limit goes up to the hard
    one and the cap is that less FD_RESERVE, not 1024 - 256 (which would refuse a GPU's 1,000 streams)."""
    import resource
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2048:
        pytest.skip(f"this machine's hard open-file limit is {hard}: nothing to raise the soft one to")
    code = ("import resource; from ttsengine.serving.network.connection_guard import FD_RESERVE, "
            "max_connections as a; cap = a(); print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0], "
            "FD_RESERVE)")
    out = subprocess.run(["bash", "-c", f"ulimit -Sn 300 && {sys.executable} -c '{code}'"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    cap, soft, reserve = map(int, out.stdout.split())
    assert soft == min(hard, 1 << 20) and cap == soft - reserve


def test_connections_whose_transport_closed_unseen_leave_the_count_before_a_refusal():
    # uvicorn's h11 protocol can upgrade a pipelined request to a WebSocket where this guard does not see it: that
    # connection's end never reaches the guard; its transport, closing, must not hold a place forever
    from ttsengine.serving.network.connection_guard import OpenConnections

    class Transport:
        def __init__(self, closing: bool):
            self.closing = closing

        def is_closing(self) -> bool:
            return self.closing

    opened = OpenConnections({Transport(False), Transport(True), Transport(False)})
    assert not opened.full(3) and opened.count == 2  # the closing one pruned: room for one more
    opened.transports.add(Transport(False))
    assert opened.full(3) and opened.count == 3
