"""`python -m handlers http` for real with two engines (TTS_DEVICES=cpu,cpu, the tiny model): /ready lists both,
requests spread over them, backpressure (503 busy) only once every engine is full, per-engine /metrics, and one
engine taken out of service (TTS_TEST_FAIL_ENGINE) while the other serves on."""

from __future__ import annotations

import io
import json
import socket
import time

import httpx
import pytest
import soundfile as sf
from test_http import _metric, scrape, server_log, start_server, stop, wait_ready

ENGINES = {"TTS_DEVICES": "cpu,cpu", "TTS_MAX_BATCH": "1"}  # one slot per engine: easy to fill
# seed 1 with this text runs for about 1000 frames on the tiny model (25-30 s on CPU): still generating for
# as long as a test looks at it
LONG = {"input": "Long.", "response_format": "pcm", "max_new_tokens": 3000, "seed": 1}
FRAME_BYTES = 2 * 24000 * 2048 / 44100  # one frame of 24 kHz 16-bit PCM
TIMEOUT = httpx.Timeout(60)  # a read that waits this long is a hang: the test fails on it


def until(condition, timeout: float = 30, what: str = "condition") -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def per_engine(url: str, name: str) -> list[float]:
    """The series `name` of engines 0 and 1 (both on cpu), read from one scrape."""
    values = {int(x.labels["engine"]): x.value for x in scrape(url)
              if x.name == name and x.labels.get("device") == "cpu" and x.labels.get("engine") in ("0", "1")}
    assert set(values) == {0, 1}, f"{name}: {values}"
    return [values[0], values[1]]


def both_ready(url: str) -> bool:
    r = httpx.get(url + "/ready", timeout=5)
    return r.status_code == 200 and [e["state"] for e in r.json()["engines"]] == ["ready", "ready"]


def open_long(client: httpx.Client, url: str) -> tuple[httpx.Response, object]:
    """A long streaming request whose first audio has arrived (so it holds a slot); -> (response, chunks).
    The chunk iterator stays referenced: dropping it would end the request."""
    r = client.send(client.build_request("POST", url + "/v1/audio/speech", json=LONG), stream=True)
    assert r.status_code == 200, r.read()
    chunks = r.iter_raw()
    assert next(chunks)
    return r, chunks


def open_queued(url: str) -> socket.socket:
    """A long request on a raw socket whose answer is never read: the engine takes it in and it waits for a
    slot (its headers would come with its first audio); closing the socket cancels it."""
    body = json.dumps(LONG).encode()
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("engines"), **ENGINES, TTS_MAX_QUEUE="1")
    try:
        wait_ready(url, proc)
        until(lambda: both_ready(url), 30, "both engines ready")
        yield url
    finally:
        stop(proc)


def test_ready_and_health_list_both_engines(server):
    r = httpx.get(server + "/ready")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    engines = r.json()["engines"]
    assert [(e["index"], e["device"], e["state"], e["error"]) for e in engines] == [(0, "cpu", "ready", None),
                                                                                    (1, "cpu", "ready", None)]
    assert [e["max_streams"] for e in engines] == [1, 1] and r.json()["max_streams"] == 2  # the slots of both
    health = httpx.get(server + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert [e["state"] for e in health.json()["engines"]] == ["ready", "ready"]
    assert per_engine(server, "tts_engine_up") == [1.0, 1.0]
    assert per_engine(server, "tts_engine_max_streams") == [1.0, 1.0]


def test_two_streams_run_one_on_each_engine(server):
    done = per_engine(server, "tts_engine_requests_completed_total")
    with httpx.Client(timeout=TIMEOUT) as client:
        first, _chunks1 = open_long(client, server)
        assert per_engine(server, "tts_engine_active_streams") in ([1.0, 0.0], [0.0, 1.0])
        second, _chunks2 = open_long(client, server)  # one slot each: only the other engine can run it at once
        assert per_engine(server, "tts_engine_active_streams") == [1.0, 1.0]
        assert per_engine(server, "tts_engine_queue_depth") == [0.0, 0.0]
        assert _metric(server, "tts_active_streams") == 2
        first.close()
        second.close()  # closing the connection cancels the generation
    until(lambda: per_engine(server, "tts_engine_active_streams") == [0.0, 0.0], 15, "the streams to end")
    # a short request after them completes, on whichever engine
    r = httpx.post(server + "/v1/audio/speech", timeout=TIMEOUT,
                   json={"input": "Short.", "response_format": "wav", "max_new_tokens": 16, "seed": 2})
    assert r.status_code == 200 and len(sf.read(io.BytesIO(r.content))[0]) == 15 * 2048
    # counted just after the last audio goes out
    until(lambda: sum(per_engine(server, "tts_engine_requests_completed_total")) == sum(done) + 1, 10, "the count")


def test_busy_only_when_every_engine_is_full(server):
    cancelled = _metric(server, "tts_requests_cancelled_total")
    rejected = _metric(server, "tts_requests_rejected_total")
    with httpx.Client(timeout=TIMEOUT) as client:
        running = [open_long(client, server) for _ in range(2)]  # the one slot of each engine
        assert per_engine(server, "tts_engine_active_streams") == [1.0, 1.0]
        # two more are taken in and wait, one per engine (TTS_MAX_QUEUE=1 each): the first engine with a
        # full queue passes the next request on to the other
        queued = [open_queued(server)]
        # settled in its engine's queue before the next one is routed (the engine takes a new request in at its
        # next step; meanwhile its occupancy can read low)
        until(lambda: sorted(per_engine(server, "tts_engine_queue_depth")) == [0.0, 1.0], 10, "the third queued")
        time.sleep(0.3)
        queued.append(open_queued(server))
        until(lambda: per_engine(server, "tts_engine_queue_depth") == [1.0, 1.0], 10, "the fourth queued")
        assert per_engine(server, "tts_engine_active_streams") == [1.0, 1.0]
        assert _metric(server, "tts_queue_depth") == 2
        # every engine full: the fifth is refused at once
        t0 = time.perf_counter()
        busy = client.post(server + "/v1/audio/speech", json=LONG)
        assert time.perf_counter() - t0 < 5
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
        error = busy.json()["error"]
        assert error["type"] == "server_busy"
        assert error["message"] == "the engines are busy (2 streams running, 2 waiting); retry shortly"
        assert _metric(server, "tts_requests_rejected_total") == rejected + 1
        for sock in queued:  # the waiting ones first, so none of them gets a slot
            sock.close()
        for r, _chunks in running:
            r.close()
    until(lambda: per_engine(server, "tts_engine_active_streams") == [0.0, 0.0]
          and per_engine(server, "tts_engine_queue_depth") == [0.0, 0.0], 15, "the engines to empty")
    until(lambda: _metric(server, "tts_requests_cancelled_total") == cancelled + 4, 10, "4 cancellations")
    assert httpx.get(server + "/health").json()["status"] == "ok"


def test_an_engine_taken_out_of_service_leaves_the_other_serving(tmp_path):
    proc, url = start_server(tmp_path, **ENGINES, TTS_TEST_FAIL_ENGINE="1@30")
    try:
        wait_ready(url, proc)
        until(lambda: both_ready(url), 30, "both engines ready")
        with httpx.Client(timeout=TIMEOUT) as client:
            # both idle: the first request goes to engine 0; engine 0 full, the second to engine 1
            first, chunks1 = open_long(client, url)
            assert per_engine(url, "tts_engine_active_streams") == [1.0, 0.0]
            second, chunks2 = open_long(client, url)
            # engine 1 fails at its 30th decode step: the second's body stops there, well before its end
            t0 = time.perf_counter()
            got = 0
            try:
                for chunk in chunks2:
                    got += len(chunk)
            except httpx.RemoteProtocolError:  # the server closes a body it cannot finish
                pass
            assert time.perf_counter() - t0 < 20
            assert got < 30 * FRAME_BYTES, got  # a few chunks, not the ~1000 frames it would have made
            second.close()

            health = httpx.get(url + "/health")
            assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
            engines = health.json()["engines"]
            assert [(e["index"], e["state"]) for e in engines] == [(0, "ready"), (1, "down")]
            assert engines[0]["error"] is None
            # one public line: the engine's own text (the CUDA error) is the server log's, not the clients'
            assert engines[1]["error"] == "the engine on cpu failed; see the server logs"
            ready = httpx.get(url + "/ready")
            assert ready.status_code == 200 and [e["state"] for e in ready.json()["engines"]] == ["ready", "down"]
            assert ready.json()["max_streams"] == 1  # only the serving engine's slot
            assert per_engine(url, "tts_engine_up") == [1.0, 0.0]
            assert per_engine(url, "tts_engine_errors_total") == [0.0, 1.0]
            assert _metric(url, "tts_ready") == 1

            assert next(chunks1)  # engine 0 generates on, untouched
            assert per_engine(url, "tts_engine_active_streams")[0] == 1.0
            first.close()  # its one slot, for the next request
        until(lambda: per_engine(url, "tts_engine_active_streams")[0] == 0.0, 15, "the first to end")
        done = per_engine(url, "tts_engine_requests_completed_total")
        for _ in range(2):  # both on engine 0: the rotation skips the engine that is down
            r = httpx.post(url + "/v1/audio/speech", timeout=TIMEOUT,
                           json={"input": "After.", "response_format": "wav", "max_new_tokens": 16, "seed": 5})
            assert r.status_code == 200, r.text
            audio, rate = sf.read(io.BytesIO(r.content))
            assert rate == 44100 and len(audio) == 15 * 2048
        until(lambda: per_engine(url, "tts_engine_requests_completed_total") == [done[0] + 2, done[1]], 10,
              "both counted on engine 0")
        assert httpx.get(url + "/health").json()["status"] == "degraded"
    finally:
        stop(proc)
    # the cut stream is one warning, not an ASGI traceback per request (the engine's failure itself is logged
    # once, with its traceback)
    log = server_log(proc)
    assert "audio stream cut short" in log and "the engine on cpu failed" in log, log[-3000:]
    assert "taken out of service: RuntimeError: CUDA error: an illegal memory access" in log, log[-3000:]
    assert "Exception in ASGI application" not in log, log[-3000:]


def test_sse_cut_after_its_first_audio_ends_with_an_error_event(tmp_path):
    # headers went out with the first audio: a later failure is reported in-band, with the failure table's
    # status and one safe line (an error before the first audio would be the route's JSON status instead)
    proc, url = start_server(tmp_path, **ENGINES, TTS_TEST_FAIL_ENGINE="0@30")
    try:
        wait_ready(url, proc)
        until(lambda: both_ready(url), 30, "both engines ready")
        r = httpx.post(url + "/v1/audio/speech", timeout=TIMEOUT, json={**LONG, "stream_format": "sse"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[0]["type"] == "speech.audio.delta" and events[-1]["type"] == "error", events[-1]
        error = events[-1]["error"]
        assert error == {"code": 503, "message": "the engine on cpu failed and was taken out of service; see the "
                                                 "server logs"}, error  # not the CUDA error's text
        assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    finally:
        stop(proc)
    assert "RuntimeError: CUDA error: an illegal memory access" in server_log(proc)  # the operators' copy
