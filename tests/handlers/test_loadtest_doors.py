"""`loadtest --door`: the same load through each of the product's doors, each a real server on the tiny model
(CPU): http (`python -m handlers http`), serve (SageMaker's streamed /invocations, `python -m handlers serve`) and
runpod (`python -m handlers runpod` taking jobs from the job queue loadtest hosts). Same seeds, same audio."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT, free_port
from test_http import served
from test_runpod import start_worker, stop_worker
from test_sagemaker import serve  # noqa: F401 - the real `serve` server, a module fixture

from ttsengine.tools.load import runpod_door
from ttsengine.tools.load.doors import JsonLines, RecordError
from ttsengine.tools.load.job_queue import JobQueue, worker_env
from ttsengine.tools.load.playback import first_stall
from ttsengine.tools.load.schedule import Share

LOAD = ["--concurrency", "2", "--requests", "3", "--max-new-tokens", "8"]


def loadtest(url: str, out, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttsengine", "loadtest", url, *LOAD, "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def level(out) -> dict:
    report = json.loads((out / "loadtest.json").read_text())
    return {"door": report["door"], **report["levels"][0]}


def test_json_lines_give_the_audio_of_each_completed_line_and_stop_at_an_error():
    lines = JsonLines()
    assert lines.feed(b'{"index": 0, "audio": "AAEC", "sample_rate": 16000}\n{"index": 1, "au') == b"\x00\x01\x02"
    assert lines.rate == 16000
    assert lines.feed(b'dio": "Aw') == b"" and not lines.done  # a line over several reads
    assert lines.feed(b'Q="}\n{"done": true}\n') == b"\x03\x04"
    assert lines.done and lines.close() == b""
    last = JsonLines()  # a body whose last line has no newline: close() parses it
    assert last.feed(b'{"audio": "BQ=="}') == b"" and last.close() == b"\x05"
    with pytest.raises(RecordError, match="too long"):
        JsonLines().feed(b'{"error": "the text is too long"}\n')


def test_first_stall_names_the_piece_the_listener_first_waited_for():
    assert first_stall([(0.0, 0.5), (0.4, 0.5), (1.3, 0.1), (2.0, 0.2)]) == 2
    assert first_stall([(1.0, 0.5), (1.4, 0.5)]) is None
    assert first_stall([(0.0, 0.1), (0.1005, 0.1)]) is None  # under a millisecond


def test_every_door_delivers_the_same_audio_for_the_same_requests(tmp_path, serve):  # noqa: F811
    got = {}
    (tmp_path / "http").mkdir()
    with served(tmp_path / "http") as url:
        run = loadtest(url, tmp_path / "http-out")
        assert run.returncode == 0, run.stderr + run.stdout
        got["http"] = level(tmp_path / "http-out")
    run = loadtest(serve[0], tmp_path / "serve-out", "--door", "serve")
    assert run.returncode == 0, run.stderr + run.stdout
    got["serve"] = level(tmp_path / "serve-out")
    port = free_port()
    queue_url = f"http://127.0.0.1:{port}"
    (tmp_path / "rp").mkdir()
    worker = start_worker(tmp_path / "rp", worker_env(queue_url, "load-worker"))
    try:
        run = loadtest(queue_url, tmp_path / "runpod-out", "--door", "runpod", "--timeout", "120")
        assert run.returncode == 0, run.stderr + run.stdout + (tmp_path / "rp" / "worker.log").read_text()
    finally:
        stop_worker(worker)
    got["runpod"] = level(tmp_path / "runpod-out")
    for door, lv in got.items():
        assert lv["door"] == door and lv["errors"] == 0 and lv["requests"] == 3, lv
        assert 0 < lv["ttfb_p50_ms"] <= lv["first_audio_p50_ms"] and lv["stall_s"] >= 0, lv
        assert lv["pieces_p50"] >= 1, lv  # every stream brought its audio in at least one piece, counted
        assert lv["end_after_audio_p95_ms"] >= 0, lv  # a request ends after its last audio, never before
    seconds = {door: lv["audio_s_per_s"] * lv["wall_s"] for door, lv in got.items()}  # all requests' audio
    assert seconds["serve"] == pytest.approx(seconds["http"], rel=1e-9) and seconds["http"] > 0
    assert seconds["runpod"] == pytest.approx(seconds["http"], rel=1e-9)


def test_runpod_door_refuses_bad_addresses_several_processes_and_says_when_no_worker_came(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    run = loadtest(url, tmp_path / "a", "--door", "runpod", "--processes", "2", timeout=60)
    assert run.returncode == 2 and "--door runpod takes one client process" in run.stderr
    for bad in ("127.0.0.1:8765", "http://127.0.0.1", "http://127.0.0.1:abc", "http://127.0.0.1:0"):
        run = loadtest(bad, tmp_path / "c", "--door", "runpod", timeout=60)
        assert run.returncode == 2 and "http://HOST:PORT" in run.stderr and "Traceback" not in run.stderr, bad
    run = loadtest(url, tmp_path / "b", "--door", "runpod", "--timeout", "1", timeout=60)
    assert run.returncode == 2 and "no RunPod worker polled" in run.stderr and "RUNPOD_WEBHOOK_GET_JOB" in run.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"http://127.0.0.1:{taken.getsockname()[1]}"
        run = loadtest(busy, tmp_path / "d", "--door", "runpod", "--timeout", "1", timeout=60)
    assert run.returncode == 2 and f"cannot host the RunPod job queue at {busy}" in run.stderr, run.stderr


def test_the_job_queue_takes_a_burst_of_connections_before_it_accepts_any():
    # a worker's posts under load open many connections at once: the kernel must hold them all in the listen backlog
    # (socketserver's default of 5 dropped the rest, retried after 1-3 s: the runpod door's first-audio tail)
    queue = JobQueue()  # not started: nothing accepts, so only the backlog holds the connections
    host, port = queue.server.server_address[:2]
    socks = []
    try:
        for _ in range(100):  # under 128, the kernel's cap (net.core.somaxconn) before Linux 5.4
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((host, port))
            socks.append(s)
        _, writable, _ = select.select([], socks, [], 2.0)
        for _ in range(20):  # the rest of the handshakes, if select returned early
            if len(writable) == len(socks):
                break
            time.sleep(0.05)
            _, writable, _ = select.select([], socks, [], 0)
        connected = [s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
        assert len(connected) == len(socks)
    finally:
        for s in socks:
            s.close()
        queue.server.server_close()


def test_a_late_post_after_the_client_gave_up_is_answered_and_kept_by_the_queue():
    """A job past loadtest's --timeout: its listener is gone with the level's loop, the worker's late post still
    gets its answer (the queue keeps it as any unlistened job's)."""
    import httpx

    queue = JobQueue().start()
    try:
        share = Share(clients=1, requests=1, indices=(0,), offsets=None)
        part = runpod_door.run_share(queue, share, {"input": "x", "response_format": "pcm"}, timeout=0.2)
        (record,) = part["records"]
        (job_id,) = queue.to_stop  # given up: asked to stop, as RunPod stops a job its client cancelled
        assert record["error"].startswith("TimeoutError") and job_id not in queue.listeners
        late = httpx.post(f"{queue.url}/job-done/w/{job_id}", content=json.dumps({"output": []}), timeout=10)
        assert late.status_code == 200 and queue.done[job_id] == {"output": []}
    finally:
        queue.stop()


def test_the_job_queue_reads_chunked_and_bad_bodies_whole_on_a_kept_alive_connection():
    """A worker may post with chunked transfer encoding; the queue must read such a body to its end, or the next
    request on the same connection would start inside it. A body that is not JSON is a 400 naming it."""
    import http.client

    queue = JobQueue().start()
    try:
        conn = http.client.HTTPConnection(*queue.server.server_address[:2], timeout=10)
        body = json.dumps({"output": [{"audio": "AAEC"}]}).encode()
        conn.request("POST", "/job-stream/w/j1", body=iter([body[:7], body[7:]]))  # no length: sent chunked
        assert conn.getresponse().read() == b"{}"
        conn.request("POST", "/job-done/w/j1", body=b"not json", headers={"Content-Length": "8"})
        bad = conn.getresponse()
        assert bad.status == 400 and b"not JSON" in bad.read()
        conn.request("POST", "/job-done/w/j1", body=b'{"output": []}')  # the same connection, still in step
        ok = conn.getresponse()
        assert ok.status == 200 and ok.read() == b"{}"
        assert queue.streamed["j1"] == [[{"audio": "AAEC"}]] and queue.done["j1"] == {"output": []}
        conn.request("POST", "/job-done/w/j2", body=b"{}", headers={"Content-Length": "-2"})
        bad = conn.getresponse()  # the body's end is unknown: answered, and the connection closed
        assert bad.status == 400 and b"not a length" in bad.read() and bad.getheader("Connection") == "close"
        conn.close()
    finally:
        queue.stop()
