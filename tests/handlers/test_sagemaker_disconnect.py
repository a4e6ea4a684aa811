"""SageMaker `python -m handlers serve` for real (the tiny model on CPU, the engines in the server's process and in
their own): a non-streaming /invocations whose client leaves stops generating (issue 50: 8 x 1,500 frames went on
for 77 s after the clients had gone)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest
from test_drain import start_serve
from test_http import stop

LONG = {"input": "Long.", "response_format": "pcm", "max_new_tokens": 3000, "seed": 1}  # ~1000 frames, 25 s+ each
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of the process and its children now (the engine process, when it has one)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == pid or int(stat[1]) == pid:
            total += (int(stat[11]) + int(stat[12])) / TICK
    return total


def until(condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def quiet(pid: int, window: float = 3.0, most: float = 0.5) -> bool:
    """Whether the server used at most `most` CPU-seconds over the next `window` seconds (idle: no generation)."""
    before = cpu_seconds(pid)
    time.sleep(window)
    return cpu_seconds(pid) - before <= most


@pytest.mark.parametrize("process", ["off", "on"])
def test_a_whole_invocation_whose_client_left_stops_generating(tmp_path, process):
    proc, url = start_serve(tmp_path, TTS_MAX_BATCH="4", TTS_ENGINE_PROCESS=process)
    port = int(url.rsplit(":", 1)[1])
    try:
        assert quiet(proc.pid), "the server is busy before the test"
        start = cpu_seconds(proc.pid)
        body = json.dumps(LONG).encode()
        socks = []
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(sock)
        until(lambda: cpu_seconds(proc.pid) - start > 3, 60, "the generation to be under way")
        for sock in socks:
            sock.close()
        # the server goes quiet within seconds (it asks every 0.25 s whether the client is there); before, the four
        # generations ran to their ends (~1000 frames each) for nobody
        until(lambda: quiet(proc.pid), 20, "the server to stop generating")
        r = httpx.post(url + "/invocations", json={"input": "After.", "max_new_tokens": 8, "seed": 2}, timeout=60)
        assert r.status_code == 200 and r.content, r.text
    finally:
        stop(proc)
    assert "Traceback" not in (tmp_path / "serve.log").read_text(errors="replace")
