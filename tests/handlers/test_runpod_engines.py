"""The RunPod job handler over two engines (TTS_DEVICES=cpu,cpu, two slots each, the tiny model), built as the
worker builds it (handlers.runpod.worker.build): its concurrency is the slots of both, concurrent jobs spread
over them, and an engine taken out of service (TTS_TEST_FAIL_ENGINE) fails its job with a clear error item while
the other serves on and the concurrency drops to its slots."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import pytest
import soundfile as sf
from conftest import MODEL_DIR

from ttsengine import DownloadConfig, RunPodConfig, from_env

pytest.importorskip("runpod", reason="runpod is a dev dependency")
from handlers.runpod import handler as rp  # noqa: E402
from handlers.runpod.worker import build  # noqa: E402

JOB_TIMEOUT = 60  # seconds: a job still running then is a hang


def build_handler(tmp_path, **env) -> rp.JobHandler:
    """The worker's handler from TTS_* variables (two CPU engines, TTS_MAX_BATCH=2), with both engines warm."""
    engine_config = from_env({"TTS_MODEL_DIR": str(MODEL_DIR), "TTS_DEVICES": "cpu,cpu", "TTS_MAX_BATCH": "2",
                              "TTS_DEFAULT_MAX_NEW_TOKENS": "16", **env})
    handler = build(RunPodConfig(data_dir=tmp_path / "voices"), engine_config, DownloadConfig())
    assert handler.engine.fleet.wait_all(60)  # ready once the first engine is; these tests want both
    return handler


def run_jobs(handler: rp.JobHandler, *inputs: dict) -> list[list[dict]]:
    """Runs the jobs at once, as RunPod's loop does with `concurrency` jobs taken together; -> each one's items."""

    async def one(i: int, job_input: dict) -> list[dict]:
        return [item async for item in handler.run({"id": f"job-{i}", "input": job_input})]

    async def all_of():
        return await asyncio.wait_for(asyncio.gather(*(one(i, x) for i, x in enumerate(inputs))), JOB_TIMEOUT)

    return asyncio.run(all_of())


def done_counts(handler: rp.JobHandler) -> list[int]:
    return [e.metrics.requests_done for e in handler.engine.fleet.engines]


def until(condition, timeout: float = 10) -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, "timed out"
        time.sleep(0.02)


def wav_frames(item: dict) -> int:
    audio, rate = sf.read(io.BytesIO(base64.b64decode(item["audio"])))
    assert rate == 44100
    return len(audio) // 2048


@pytest.fixture(scope="module")
def handler(tmp_path_factory):
    h = build_handler(tmp_path_factory.mktemp("rp-engines"))
    yield h
    h.engine.close()


def test_concurrency_is_the_slots_of_both_engines(handler):
    assert [e.max_streams for e in handler.engine.fleet.engines] == [2, 2]
    assert handler.concurrency(0) == 4


def test_two_concurrent_jobs_land_one_on_each_engine(handler):
    before = done_counts(handler)
    outputs = run_jobs(handler, *({"text": f"Job number {i}.", "seed": i, "max_new_tokens": 12} for i in (1, 2)))
    for seed, items in zip((1, 2), outputs):
        assert len(items) == 1 and "error" not in items[0], items
        assert items[0]["seed"] == seed and items[0]["frames"] == 11 and wav_frames(items[0]) == 11
    until(lambda: sum(done_counts(handler)) == sum(before) + 2)  # counted just after the result is handed over
    assert [n - b for n, b in zip(done_counts(handler), before)] == [1, 1]


def test_a_full_take_of_jobs_is_served_by_both_engines(handler):
    """As many jobs at once as concurrency() asks RunPod for: all served, none refused, both engines used."""
    before = done_counts(handler)
    n = handler.concurrency(0)
    outputs = run_jobs(handler, *({"input": f"Job {i}.", "seed": i, "max_new_tokens": 12, "stream": True}
                                  for i in range(n)))
    assert [items[-1].get("done") for items in outputs] == [True] * n, [items[-1] for items in outputs]
    assert all(items[-1]["frames"] == 11 for items in outputs)
    until(lambda: sum(done_counts(handler)) == sum(before) + n)
    assert all(a > b for a, b in zip(done_counts(handler), before))


def test_an_engine_down_fails_its_job_clearly_and_the_other_serves_on(tmp_path):
    handler = build_handler(tmp_path, TTS_TEST_FAIL_ENGINE="1@30")
    try:
        fleet = handler.engine.fleet
        assert handler.concurrency(0) == 4
        # two streamed jobs at once, one per engine; 60 frames each run past engine 1's 30th decode step
        long_job = {"text": "Long.", "seed": 1, "max_new_tokens": 60, "format": "pcm", "stream": True}
        t0 = time.perf_counter()
        outputs = run_jobs(handler, long_job, long_job)
        assert time.perf_counter() - t0 < JOB_TIMEOUT
        failed = [items for items in outputs if "error" in items[-1]]
        finished = [items for items in outputs if items[-1].get("done")]
        assert len(failed) == 1 and len(finished) == 1, [items[-1] for items in outputs]

        *pieces, last = failed[0]
        assert set(last) == {"error"} and pieces and all("audio" in p for p in pieces)  # audio, then the error
        error = json.loads(last["error"])
        assert error["status"] == 503 and error["error_type"] == "busy"  # another worker or engine takes a retry
        # one public line, as the HTTP server's: the CUDA error's text stays in the worker's log
        assert error["error_message"] == "the engine on cpu failed and was taken out of service; see the server " \
                                         "logs", error
        assert "Traceback" not in last["error"]
        assert finished[0][-1]["frames"] == 59  # the job on engine 0 is untouched

        assert [e.state for e in fleet.engines] == ["ready", "down"]
        assert [e.metrics.failed_streams for e in fleet.engines] == [0, 1]
        assert handler.concurrency(0) == 2  # RunPod now sends only as many jobs as engine 0 has slots
        assert handler.engine.health()["status"] == "degraded"

        before = done_counts(handler)
        (items,) = run_jobs(handler, {"input": "After the failure.", "seed": 7, "response_format": "wav",
                                      "max_new_tokens": 16})
        assert len(items) == 1 and "error" not in items[0], items
        assert items[0]["seed"] == 7 and wav_frames(items[0]) == 15
        until(lambda: done_counts(handler) == [before[0] + 1, before[1]])  # served by engine 0
    finally:
        handler.engine.close()


def test_a_job_stopped_while_it_is_planned_generates_nothing(tmp_path):
    """RunPod stops a job (its /cancel: the handler's task is cancelled) while the engine still encodes the job's
    long reference: the request is given up, and no stream generates for nobody afterwards (issue 50)."""
    import contextlib

    import numpy as np

    h = build_handler(tmp_path, TTS_DEVICES="cpu")
    try:
        buf = io.BytesIO()
        sf.write(buf, (0.2 * np.random.default_rng(0).standard_normal(50 * 22050)).astype(np.float32), 22050,
                 format="WAV")  # 50 s: seconds of codec work on a CPU
        reference = {"text": "A voice.", "audio": base64.b64encode(buf.getvalue()).decode()}
        job = {"id": "stopped", "input": {"text": "Keep talking for a long while.", "seed": 1, "stream": True,
                                          "max_new_tokens": 3000, "references": [reference]}}

        async def stop_while_planned():
            task = asyncio.create_task(anext(h.run(job)))
            await asyncio.sleep(0.3)  # in its planning (the reference is being encoded)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        before = h.engine.stats().total
        asyncio.run(stop_while_planned())
        time.sleep(5)  # a stream taken in for nobody would be generating by now
        after = h.engine.stats().total
        assert h.engine.fleet.open_streams == 0 and after.running == 0, (after.running, after.waiting)
        assert after.frames - before.frames < 100, after.frames - before.frames  # at most a step or two, if taken
    finally:
        h.engine.close()
