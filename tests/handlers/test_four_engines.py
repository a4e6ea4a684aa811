"""Four engines, each in a process of its own (TTS_DEVICES=cpu,cpu,cpu,cpu, TTS_ENGINE_PROCESS=on: issue 49's layout
on CPUs), through every door, for real: `python -m handlers http` (direct_admit, the default: the event loop hands
each request to its engine process) routes one stream per engine, is busy only when all four are full, and serves on
with three when one fails mid-run; SageMaker's `serve` and the RunPod worker the same: concurrent requests spread
over the four, one engine failing fails only its request, nothing hangs."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import MODEL_DIR
from test_drain import start_serve
from test_http import _metric, scrape, start_server, stop, wait_ready
from test_http_engines import FRAME_BYTES, LONG, TIMEOUT, open_long, open_queued, until
from test_sagemaker_engines import concurrently, frames_of, invoke

from ttsengine import DownloadConfig, RunPodConfig, from_env

FOUR = {"TTS_DEVICES": "cpu,cpu,cpu,cpu", "TTS_MAX_BATCH": "1", "TTS_MAX_QUEUE": "1", "TTS_ENGINE_PROCESS": "on"}


def engines(url: str, name: str) -> list[float]:
    """The series `name` of engines 0-3, read from one scrape."""
    values = {int(x.labels["engine"]): x.value for x in scrape(url)
              if x.name == name and x.labels.get("engine") in ("0", "1", "2", "3")}
    assert set(values) == {0, 1, 2, 3}, f"{name}: {values}"
    return [values[i] for i in range(4)]


def all_ready(url: str) -> bool:
    r = httpx.get(url + "/ready", timeout=5)
    return r.status_code == 200 and [e["state"] for e in r.json()["engines"]] == ["ready"] * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("four"), **FOUR)
    try:
        wait_ready(url, proc)
        until(lambda: all_ready(url), 60, "four engines ready")
        yield url
    finally:
        stop(proc)


def test_four_streams_one_per_engine_and_busy_only_when_all_four_are_full(server):
    assert httpx.get(server + "/ready").json()["max_streams"] == 4
    rejected = _metric(server, "tts_requests_rejected_total")
    cancelled = _metric(server, "tts_requests_cancelled_total")
    with httpx.Client(timeout=TIMEOUT) as client:
        running = [open_long(client, server) for _ in range(4)]  # one slot each: one stream on every engine
        assert engines(server, "tts_engine_active_streams") == [1.0] * 4
        queued = []
        for n in range(1, 5):  # then one queue place each
            queued.append(open_queued(server))
            until(lambda n=n: sum(engines(server, "tts_engine_queue_depth")) == n, 10, f"{n} queued")
        assert engines(server, "tts_engine_queue_depth") == [1.0] * 4
        busy = client.post(server + "/v1/audio/speech", json=LONG)  # every engine full: refused at once
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
        assert busy.json()["error"]["message"] == "the engines are busy (4 streams running, 4 waiting); retry shortly"
        assert _metric(server, "tts_requests_rejected_total") == rejected + 1
        for sock in queued:
            sock.close()
        for r, _chunks in running:
            r.close()
    until(lambda: engines(server, "tts_engine_active_streams") == [0.0] * 4
          and engines(server, "tts_engine_queue_depth") == [0.0] * 4, 20, "the engines to empty")
    until(lambda: _metric(server, "tts_requests_cancelled_total") == cancelled + 8, 10, "8 cancellations")
    r = httpx.post(server + "/v1/audio/speech", timeout=TIMEOUT,
                   json={"input": "Short.", "response_format": "pcm", "max_new_tokens": 16, "seed": 2})
    assert r.status_code == 200 and len(r.content) > 0


def test_one_engine_of_four_failing_leaves_three_serving_and_nothing_hangs(tmp_path):
    proc, url = start_server(tmp_path, **FOUR, TTS_TEST_FAIL_ENGINE="2@30")
    try:
        wait_ready(url, proc)
        until(lambda: all_ready(url), 60, "four engines ready")
        with httpx.Client(timeout=TIMEOUT) as client:
            streams = [open_long(client, url) for _ in range(4)]  # one on each engine (engine 2 may be failing)
            # engine 2 fails at its 30th decode step: exactly one body stops there, well before its end
            got, cut = [0] * 4, []
            t0 = time.perf_counter()
            while not cut and time.perf_counter() - t0 < 30:
                for i, (_r, chunks) in enumerate(streams):
                    try:
                        got[i] += len(next(chunks))
                    except (StopIteration, httpx.RemoteProtocolError):  # the server closes what it cannot finish
                        cut.append(i)
            assert len(cut) == 1 and got[cut[0]] < 30 * FRAME_BYTES, (cut, got)
            health = httpx.get(url + "/health").json()
            assert health["status"] == "degraded", health
            assert [e["state"] for e in health["engines"]] == ["ready", "ready", "down", "ready"]
            assert httpx.get(url + "/ready").json()["max_streams"] == 3
            assert engines(url, "tts_engine_active_streams") == [1.0, 1.0, 0.0, 1.0]
            for i, (r, chunks) in enumerate(streams):  # the other three generate on
                if i not in cut:
                    assert next(chunks)
                r.close()
        until(lambda: engines(url, "tts_engine_active_streams") == [0.0] * 4, 20, "the streams to end")
        done = engines(url, "tts_engine_requests_completed_total")
        with httpx.Client(timeout=TIMEOUT) as client:  # three at once: one on each engine still up
            answers = [client.post(url + "/v1/audio/speech", json={"input": "After.", "response_format": "pcm",
                                                                     "max_new_tokens": 16, "seed": s})
                       for s in range(3)]
        assert all(a.status_code == 200 and a.content for a in answers), [a.text for a in answers]
        after = engines(url, "tts_engine_requests_completed_total")
        until(lambda: sum(engines(url, "tts_engine_requests_completed_total")) == sum(done) + 3, 10, "3 counted")
        assert after[2] == done[2] == 0  # none went to the engine that is down
    finally:
        stop(proc)


# ---- SageMaker's serve ------------------------------------------------------------------------------------------
def test_sagemaker_serve_spreads_over_four_and_one_failing_fails_only_its_invocation(tmp_path):
    proc, url = start_serve(tmp_path, TTS_DEVICES="cpu,cpu,cpu,cpu", TTS_ENGINE_PROCESS="on", TTS_MAX_BATCH="1",
                            TTS_TEST_FAIL_ENGINE="2@30")
    try:
        time.sleep(1)  # every engine process warm (they load side by side)
        # four at once, one per engine (one slot each); 60 frames run past engine 2's 30th decode step
        t0 = time.perf_counter()
        responses = concurrently(lambda body: invoke(url, body),
                                 *(({"text": "Long.", "seed": s, "max_new_tokens": 60},) for s in range(4)))
        assert time.perf_counter() - t0 < 90
        ok = [r for r in responses if r.status_code == 200]
        failed = [r for r in responses if r.status_code != 200]
        assert len(ok) == 3 and len(failed) == 1, [(r.status_code, r.text[:200]) for r in responses]
        assert all(frames_of(r) == 59 for r in ok)
        assert failed[0].status_code == 503 and failed[0].json()["error"]["message"] == \
            "the engine on cpu failed and was taken out of service; see the server logs"
        assert httpx.get(url + "/ping").status_code == 200  # three engines serve: SageMaker keeps routing here
        after = concurrently(lambda body: invoke(url, body),
                             *(({"text": "After.", "seed": s, "max_new_tokens": 16},) for s in range(3)))
        assert [r.status_code for r in after] == [200] * 3 and all(frames_of(r) == 15 for r in after)
    finally:
        stop(proc)


# ---- the RunPod worker ------------------------------------------------------------------------------------------
def test_runpod_worker_spreads_over_four_and_one_failing_fails_only_its_job(tmp_path):
    pytest.importorskip("runpod", reason="runpod is a dev dependency")
    from test_runpod_engines import run_jobs

    from handlers.runpod.worker import build

    engine_config = from_env({"TTS_MODEL_DIR": str(MODEL_DIR), "TTS_DEVICES": "cpu,cpu,cpu,cpu",
                              "TTS_ENGINE_PROCESS": "on", "TTS_MAX_BATCH": "1", "TTS_TEST_FAIL_ENGINE": "2@30",
                              "TTS_DEFAULT_MAX_NEW_TOKENS": "16"})
    handler = build(RunPodConfig(data_dir=tmp_path / "voices"), engine_config, DownloadConfig())
    try:
        fleet = handler.engine.fleet
        assert fleet.processes == 4 and fleet.wait_all(120)
        assert handler.concurrency(0) == 4  # the slots of all four
        long_job = {"text": "Long.", "seed": 1, "max_new_tokens": 60, "format": "pcm", "stream": True}
        outputs = run_jobs(handler, *[long_job] * 4)
        failed = [items for items in outputs if "error" in items[-1]]
        finished = [items for items in outputs if items[-1].get("done")]
        assert len(failed) == 1 and len(finished) == 3, [items[-1] for items in outputs]
        error = json.loads(failed[0][-1]["error"])
        assert error["status"] == 503 and error["error_type"] == "busy", error
        assert all(items[-1]["frames"] == 59 for items in finished)
        until(lambda: handler.concurrency(0) == 3, 10, "the failed engine's slot out of the concurrency")
        assert handler.engine.health()["status"] == "degraded"
        outputs = run_jobs(handler, *({"input": f"After {i}.", "seed": i, "max_new_tokens": 12} for i in range(3)))
        assert all(len(items) == 1 and "error" not in items[0] for items in outputs), outputs
    finally:
        handler.engine.close()
