"""SIGTERM drains, for real: `python -m handlers http` and `serve` keep listening while the requests in flight
finish (new ones 503 with Retry-After, /ready and /ping 503), then exit; past TTS_DRAIN_SECONDS what is left is
cut so that its client can tell: an aborted chunked body for raw audio, an error event for SSE, a JSON 503 for a
whole file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from conftest import ROOT, complete_model, free_port
from test_http import server_log, start_server, wait_ready

SPEECH = "/v1/audio/speech"
FRAMES = 439  # seed 1 with "Long." runs for ~1000 frames on the tiny model: this many is 20.4 s of audio
STREAM = {"input": "Long.", "response_format": "pcm", "max_new_tokens": FRAMES + 1, "seed": 1}
PCM_RATE = 24000
EXITED = (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled once it has shut down


def read_all(r: httpx.Response, chunks) -> tuple[int, str | None]:
    """-> (bytes read, None if the body ended properly, else the transport error)."""
    got = 0
    try:
        for chunk in chunks:
            got += len(chunk)
    except httpx.HTTPError as e:
        return got, f"{type(e).__name__}: {e}"
    return got, None


def test_sigterm_lets_a_20_second_stream_finish_and_refuses_new_work(tmp_path):
    proc, url = start_server(tmp_path, TTS_MAX_BATCH="1", TTS_DRAIN_SECONDS="120")
    try:
        wait_ready(url, proc)
        with httpx.Client(timeout=60) as client:
            r = client.send(client.build_request("POST", url + SPEECH, json=STREAM), stream=True)
            assert r.status_code == 200
            chunks = r.iter_raw()
            first = next(chunks)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            # still listening: load balancers read /ready, new requests are turned away with a retry hint
            ready = httpx.get(url + "/ready", timeout=5)
            assert ready.status_code == 503 and ready.json() == {"status": "draining"}
            assert httpx.get(url + "/health", timeout=5).json()["status"] == "draining"
            late = httpx.post(url + SPEECH, json={"input": "Too late."}, timeout=10)
            assert late.status_code == 503 and late.headers["retry-after"] == "5", late.text
            assert "shutting down" in late.json()["error"]["message"]
            got, broken = read_all(r, chunks)
            assert broken is None  # the whole body, properly terminated
            seconds = (len(first) + got) / 2 / PCM_RATE
            assert abs(seconds - FRAMES * 2048 / 44100) < 0.05, seconds
        assert proc.wait(timeout=30) in EXITED
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in server_log(proc), server_log(proc)[-3000:]


def test_past_the_deadline_what_is_left_ends_in_a_way_the_client_can_tell(tmp_path):
    proc, url = start_server(tmp_path, TTS_MAX_BATCH="1", TTS_DRAIN_SECONDS="2")
    try:
        wait_ready(url, proc)
        results = {}

        def whole_file():  # queued behind the stream (one slot): never starts
            results["wav"] = httpx.post(url + "/v1/tts", timeout=60, json={
                "text": "Queued.", "format": "wav", "max_new_tokens": 50, "seed": 3})

        def sse():  # queued too: its headers would come with its first audio, which never comes
            results["sse"] = httpx.post(url + SPEECH, timeout=60, json={
                "input": "Queued too.", "stream_format": "sse", "max_new_tokens": 50})

        with httpx.Client(timeout=60) as client:
            r = client.send(client.build_request("POST", url + SPEECH, json={**STREAM, "max_new_tokens": 3000}),
                            stream=True)
            chunks = r.iter_raw()
            assert r.status_code == 200 and next(chunks)
            waiters = [threading.Thread(target=whole_file), threading.Thread(target=sse)]
            for w in waiters:
                w.start()
            time.sleep(1)
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            got, broken = read_all(r, chunks)
            assert broken is not None and 2 < time.perf_counter() - t0 < 15, (got, broken)  # cut, visibly
            for w in waiters:
                w.join(30)
        for name in ("wav", "sse"):  # nothing was sent of either: the JSON 503, as for any queued request
            got = results[name]
            assert got.status_code == 503 and got.headers["content-type"] == "application/json", (name, got.text)
            assert "shut down before this request finished" in got.json()["error"]["message"]
        assert proc.wait(timeout=30) in EXITED
    finally:
        if proc.poll() is None:
            proc.kill()
    log = server_log(proc)
    assert "draining for up to 2 s" in log and "Exception in ASGI application" not in log, log[-3000:]


def start_serve(tmp_path, **env) -> tuple[subprocess.Popen, str]:
    """`python -m handlers serve` on the tiny model, ready (/ping 200)."""
    port = free_port()
    model = complete_model(tmp_path / "model")  # serve keeps stored voices beside the model
    env = {**os.environ, "TTS_MODEL_DIR": str(model), "TTS_DEVICE": "cpu", "SAGEMAKER_BIND_TO_PORT": str(port),
           "TTS_LOG_LEVEL": "WARNING", **env}
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen([sys.executable, "-m", "handlers", "serve"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 120  # two engine processes on a busy 2-core CI machine
    while True:
        if proc.poll() is not None:
            raise RuntimeError((tmp_path / "serve.log").read_text())
        try:
            if httpx.get(url + "/ping", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.time() > end:
            proc.kill()
            raise TimeoutError("serve did not become ready")
        time.sleep(0.1)


def test_serve_drains_too(tmp_path):
    """SageMaker's `serve`: /ping 503 while a streamed invocation finishes; then it exits."""
    proc, url = start_serve(tmp_path, TTS_DRAIN_SECONDS="60")
    try:
        body = json.dumps({"input": "Long.", "seed": 1, "max_new_tokens": 121, "response_format": "pcm"})
        with httpx.stream("POST", url + "/invocations", content=body, timeout=60, headers={
                "content-type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "stream=true"}) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines))["index"] == 0
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            ping = httpx.get(url + "/ping", timeout=5)
            assert ping.status_code == 503 and "shutting down" in ping.json()["error"]["message"]
            records = [json.loads(line) for line in lines if line]
        assert records[-1]["done"] is True and records[-1]["frames"] == 120, records[-1]
        assert proc.wait(timeout=30) in EXITED
    finally:
        if proc.poll() is None:
            proc.kill()
