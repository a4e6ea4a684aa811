"""The RunPod adapter: the job handler on the CPU engine, the real worker loop (`python -m handlers runpod`)
against a local fake job queue, and RunPod's own local test API (--rp_serve_api)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import MODEL_DIR, ROOT, complete_model, free_port, s3_client
from fake_runpod import JobQueue

from ttsengine import RunPodConfig, SynthesisRequest, encode_audio
from ttsengine.serving import chunk_trace

pytest.importorskip("runpod", reason="runpod is a dev dependency")
from handlers.runpod import handler as rp  # noqa: E402

WORKER_ENV = {"TTS_DEVICE": "cpu", "TTS_MODEL_DIR": str(MODEL_DIR), "TTS_DEFAULT_MAX_NEW_TOKENS": "16",
              "TTS_MAX_BATCH": "4", "PYTHONUNBUFFERED": "1"}


def run_job(handler: rp.JobHandler, job_input, job_id: str = "job-1") -> list[dict]:
    async def collect():
        return [item async for item in handler.run({"id": job_id, "input": job_input})]

    return asyncio.run(collect())


def error_of(item: dict) -> dict:
    assert set(item) == {"error"}, item
    return json.loads(item["error"])


def expected(engine, text: str, seed: int, fmt: str = "wav") -> bytes:
    result = engine.submit(SynthesisRequest(text=text, seed=seed, max_new_tokens=16)).result()
    return encode_audio(result.audio, result.sample_rate, fmt, None, 1.0).data


@pytest.fixture
def handler(engine, tmp_path):
    return rp.JobHandler(engine, None, RunPodConfig(data_dir=tmp_path))


# ---- the handler, in process ------------------------------------------------------------------------
def test_whole_job_is_one_item_equal_to_direct_synthesis(handler, engine):
    items = run_job(handler, {"text": "Hello RunPod.", "seed": 5, "max_new_tokens": 16})
    assert len(items) == 1
    item = items[0]
    assert item["format"] == "wav" and item["content_type"] == "audio/wav" and item["seed"] == 5
    assert base64.b64decode(item["audio"]) == expected(engine, "Hello RunPod.", 5)
    assert item["frames"] == 15 and item["bytes"] == 44 + 15 * 2048 * 2


def test_streamed_pieces_are_bounded_and_add_up(handler, engine, monkeypatch):
    monkeypatch.setattr(rp, "PIECE_BYTES", 6000)  # the real bound is 768 KiB; small here to force splitting
    items = run_job(handler, {"input": "Streamed in pieces.", "seed": 9, "response_format": "wav",
                              "max_new_tokens": 16, "stream": True})
    *pieces, done = items
    assert done["done"] is True and done["seed"] == 9 and done["frames"] == 15 and done["pieces"] == len(pieces)
    assert [p["index"] for p in pieces] == list(range(len(pieces))) and len(pieces) > 3
    raw = [base64.b64decode(p["audio"]) for p in pieces]
    assert all(len(r) <= 6000 for r in raw) and {p["sample_rate"] for p in pieces} == {44100}
    # the streamed WAV declares an open length; the samples equal the whole file's
    assert b"".join(raw)[44:] == expected(engine, "Streamed in pieces.", 9)[44:]
    assert done["bytes"] == sum(map(len, raw))


def test_pcm_stream_is_24k_like_openai(handler):
    items = run_job(handler, {"input": "Raw.", "response_format": "pcm", "stream": True, "max_new_tokens": 16})
    assert items[0]["sample_rate"] == 24000 and items[0]["content_type"] == "audio/pcm"
    assert sum(len(base64.b64decode(i["audio"])) for i in items[:-1]) == items[-1]["bytes"]


def test_traced_streamed_job_logs_where_its_chunks_time_went(handler, monkeypatch, caplog):
    """TTS_TRACE_CHUNKS=on: the worker has no /metrics, so each streamed job ends with one log line of its chunks'
    stages (the engine's pace as the front saw it, wake, encode, the SDK's post, the trail)."""
    monkeypatch.setattr(chunk_trace, "_enabled", True)  # what worker.main's chunk_trace.enable(cfg.trace_chunks) sets
    caplog.set_level(logging.INFO, logger="handlers.runpod")
    items = run_job(handler, {"input": "Traced.", "response_format": "pcm", "stream": True, "max_new_tokens": 16},
                    job_id="traced")
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("trace job traced:")]
    got = re.fullmatch(r"trace job traced: chunks (\d+), pieces (\d+), arriving every [\d.]+ ms, "
                       r"wake [\d.]+ / [\d.]+ ms, encode [\d.]+ / [\d.]+ ms, post [\d.]+ / [\d.]+ ms, trail [\d.]+ ms",
                       line)
    assert got, line
    assert int(got[2]) == len(items) - 1 and 1 <= int(got[1]), line  # every audio item posted and timed
    monkeypatch.setattr(chunk_trace, "_enabled", False)
    caplog.clear()
    run_job(handler, {"input": "Traced.", "response_format": "pcm", "stream": True, "max_new_tokens": 16})
    assert not [r for r in caplog.records if "trace job" in r.getMessage()]  # off (the default): no line


def test_a_streamed_job_behind_its_consumer_sends_what_was_made_since_in_one_item(engine, tmp_path):
    # feature runpod_coalesce: the SDK posts item by item; while it was busy with the first one the engine made the
    # rest, which goes out as one item. The same job with the switch off: an item per chunk, the same bytes
    body = {"input": "Coalesced while the post was out.", "seed": 4, "response_format": "pcm", "max_new_tokens": 64,
            "stream": True}

    async def behind(handler):
        gen = handler.run({"id": "c", "input": body})
        first = await gen.__anext__()
        for _ in range(600):  # the consumer busy until the engine has made the whole job (a loaded CI: 30 s)
            await asyncio.sleep(0.05)
            if not engine.stats().running:
                break
        await asyncio.sleep(1.5)  # its last chunks through the codec and the resampler
        return [first, *[item async for item in gen]]

    items = {on: asyncio.run(behind(rp.JobHandler(engine, None, RunPodConfig(data_dir=tmp_path), coalesce=on)))
             for on in (True, False)}
    pieces = {on: [base64.b64decode(i["audio"]) for i in got[:-1]] for on, got in items.items()}
    assert pieces[True][0] == pieces[False][0]  # the first chunk alone, as without
    # the rest together: in one item once the codec's tail is in; on a loaded machine a late chunk or two apart
    assert len(pieces[False]) >= 6 and len(pieces[True]) <= max(3, len(pieces[False]) // 2)
    assert b"".join(pieces[True]) == b"".join(pieces[False])
    done = items[True][-1]
    assert done["done"] and done["pieces"] == len(pieces[True]) and done["bytes"] == sum(map(len, pieces[True]))


def test_an_items_repr_names_its_audio_length_and_its_json_is_the_dicts():
    # RunPod's SDK formats every item into debug f-strings: an audio item's repr must not copy its base64
    item = rp.Item({"index": 0, "audio": "QUJD" * 5000, "format": "pcm"})
    assert repr(item) == "{'index': 0, 'audio': <20000 characters>, 'format': 'pcm'}"
    error = rp.Item(rp.error_item(ValueError("x" * 100)))
    assert repr(error) == repr(dict(error))  # an error's text stays whole in the SDK's lines
    assert f"{ {'output': item} }" == "{'output': " + repr(item) + "}"
    assert json.loads(json.dumps(item)) == dict(item)


@pytest.mark.parametrize("job_input, words", [
    ("just a string", "input must be an object"),
    ({}, "needs `text`"),
    ({"text": ""}, "text"),
    ({"text": "x", "format": "exe"}, "format"),
    ({"text": "x", "stream": "yes"}, "stream: must be true or false"),
    ({"text": "x", "upload": True}, "RUNPOD_S3_BUCKET"),
    ({"input": "x", "voice": "nobody"}, "unknown voice 'nobody'"),
    ({"text": "x", "references": [{"text": "t", "audio": "%%%"}]}, "not valid base64"),
])
def test_bad_input_is_a_clear_error_item(handler, job_input, words):
    items = run_job(handler, job_input)
    assert len(items) == 1
    err = error_of(items[0])
    assert err["status"] == 400 and err["error_type"] == "invalid_input" and words in err["error_message"], err


def test_ignored_fields_are_named_in_the_output(handler):
    (item,) = run_job(handler, {"text": "Hi.", "max_new_tokens": 8, "bogus": 1})
    assert item["ignored_fields"] == ["bogus"] and item["frames"] == 7
    *pieces, done = run_job(handler, {"text": "Hi.", "max_new_tokens": 8, "stream": True, "Voice": "x"})
    assert done["done"] and done["ignored_fields"] == ["Voice"] and pieces
    (item,) = run_job(handler, {"text": "Hi.", "max_new_tokens": 8})
    assert "ignored_fields" not in item


@pytest.mark.parametrize("stream", [False, True])
def test_no_audio_is_an_error_item(handler, stream):
    items = run_job(handler, {"text": "Nothing.", "max_new_tokens": 1, "stream": stream})
    assert len(items) == 1
    err = error_of(items[0])
    assert err["status"] == 422 and "produced no audio" in err["error_message"], err


def test_output_over_the_inline_limit_is_never_silently_dropped(engine, tmp_path):
    small = rp.JobHandler(engine, None, RunPodConfig(max_inline_bytes=4096, data_dir=tmp_path))
    err = error_of(run_job(small, {"text": "Too big to inline.", "max_new_tokens": 16})[0])
    assert err["status"] == 400 and "inline limit of 4096" in err["error_message"]
    assert "upload" in err["error_message"] and "stream" in err["error_message"]


def test_upload_to_s3_returns_a_working_url(engine, tmp_path, s3_server, monkeypatch):
    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    s3_client(s3_server).create_bucket(Bucket="tts-out")
    up = rp.JobHandler(engine, None, RunPodConfig(s3_bucket="tts-out", max_inline_bytes=4096, data_dir=tmp_path))
    for job_input, reason in (({"text": "Uploaded.", "seed": 4, "max_new_tokens": 16}, "over the inline limit"),
                              ({"text": "Uploaded.", "seed": 4, "max_new_tokens": 16, "format": "mp3",
                                "upload": True}, "requested")):
        item = run_job(up, job_input, job_id=f"job-{reason[:4]}")[0]
        assert "audio" not in item and item["uploaded"] == reason, item
        body = httpx.get(item["url"]).content
        assert len(body) == item["bytes"]
        if job_input.get("format") != "mp3":
            assert body == expected(engine, "Uploaded.", 4)


def test_missing_bucket_fails_the_job_with_the_reason(engine, tmp_path, s3_server, monkeypatch):
    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    up = rp.JobHandler(engine, None, RunPodConfig(s3_bucket="no-such-bucket", data_dir=tmp_path))
    err = error_of(run_job(up, {"text": "x", "max_new_tokens": 4, "upload": True})[0])
    assert err["status"] == 500 and "s3://no-such-bucket/" in err["error_message"]


def test_concurrency_follows_the_engine_slots(engine, tmp_path):
    assert rp.JobHandler(engine, None, RunPodConfig()).concurrency(1) == engine.max_streams == 8
    assert rp.JobHandler(engine, None, RunPodConfig(concurrency=3)).concurrency(1) == 3


def test_a_stopped_job_frees_its_slot(handler, engine):
    async def first_then_stop():
        gen = handler.run({"id": "s", "input": {"text": "Stop me. " * 20, "stream": True, "max_new_tokens": 2000}})
        first = await gen.__anext__()
        await gen.aclose()  # what RunPod's task cancellation does to the generator
        return first

    assert "audio" in asyncio.run(first_then_stop())
    end = time.time() + 10
    while engine.stats().running and time.time() < end:
        time.sleep(0.05)
    assert engine.stats().running == 0


# ---- the real worker loop against a fake queue ------------------------------------------------------
def start_worker(tmp_path, extra_env: dict, *args: str) -> subprocess.Popen:
    env = {**os.environ, **WORKER_ENV, "TTS_DATA_DIR": str(tmp_path / "voices"), **extra_env}
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed by the process's exit
    return subprocess.Popen([sys.executable, "-m", "handlers", "runpod", *args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def stop_worker(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return proc.returncode


def test_worker_loop_streams_batches_reports_progress_and_drains(tmp_path):
    queue = JobQueue().start()
    # all queued before the worker starts: its first take asks for a batch of them
    queue.submit("stream", {"text": "Streaming job.", "streaming": True, "seed": 1, "format": "pcm"})
    queue.submit("whole", {"input": "A whole file.", "seed": 2, "response_format": "flac"})
    queue.submit("bad", {"text": "x", "temperature": 7})
    queue.submit("long", {"text": "The first sentence is right here. The second sentence is right here. "
                                  "The third sentence is right here. The fourth sentence is right here.",
                          "chunk_length": 50, "seed": 3, "max_new_tokens": 48, "stream": True})
    queue.submit("stopped", {"text": "Long. " * 40, "stream": True, "max_new_tokens": 3000})
    proc = start_worker(tmp_path, queue.env())
    try:
        queue.wait_streamed("stopped", 1, timeout=120)
        queue.cancel("stopped")
        queue.wait_done(["stream", "whole", "bad", "long"], timeout=120)
        time.sleep(2)
        assert "stopped" not in queue.done  # a stopped job posts nothing; its slot is freed
        assert max(len(ids) for _, ids in queue.taken) >= 2, queue.taken  # jobs taken together, batched
        assert any(r.startswith("GET /job-take-batch/fake-worker") for r in list(queue.requests))  # a snapshot
        # streams ran at once (one engine batch): some two of the streamed jobs overlap in time. Not a fixed pair:
        # a short job may finish before a long one's text is planned (seen in CI with engine processes)
        spans = {j: (t[0], t[-1]) for j, t in queue.stream_times.items() if j in ("stream", "long", "stopped")}
        assert any(a[0] < b[1] and b[0] < a[1] for i, a in spans.items() for j, b in spans.items() if i < j), spans

        *pieces, done = queue.streamed["stream"]
        assert done["done"] and done["seed"] == 1 and pieces and pieces[0]["sample_rate"] == 24000
        assert queue.done["stream"]["output"] == queue.streamed["stream"]  # the aggregate for /runsync

        (whole,) = queue.done["whole"]["output"]
        assert whole["format"] == "flac" and base64.b64decode(whole["audio"])[:4] == b"fLaC"

        err = json.loads(queue.done["bad"]["error"])
        assert err["status"] == 400 and "temperature" in err["error_message"]

        long_item = queue.done["long"]["output"][-1]
        assert [c["text_chunks"] for c in queue.progress["long"]] == [4] * len(queue.progress["long"])
        done_counts = [c["text_chunks_done"] for c in queue.progress["long"]]  # one per finished chunk, polled
        assert done_counts and done_counts == sorted(set(done_counts)) and 1 <= done_counts[-1] <= 4, done_counts
        assert long_item["frames"] >= done_counts[-1]
        # SIGTERM with a job in flight: the loop takes nothing new, finishes the job, posts it, exits 0
        queue.submit("inflight", {"text": "Drain me now. " * 8, "stream": True, "max_new_tokens": 120})
        queue.wait_streamed("inflight", 1, timeout=60)
        assert "inflight" not in queue.done
        assert stop_worker(proc) == 0
        assert queue.done["inflight"]["output"][-1]["done"] is True, queue.done["inflight"]
        worker_log = (tmp_path / "worker.log").read_text()
        assert "job pickup: as soon as fetched (runpod_pickup)" in worker_log
        # the SDK at INFO (RUNPOD_LOG_LEVEL unset): its three DEBUG lines per streamed item are not printed
        assert "Log level set to INFO" in worker_log and "Intermediate results sent." not in worker_log
    finally:
        stop_worker(proc)
        queue.stop()
        print((tmp_path / "worker.log").read_text()[-3000:])


def test_aggregate_stream_off_leaves_every_jobs_items_out_of_its_result(tmp_path):
    """RUNPOD_AGGREGATE_STREAM=off: /stream gets every item; no job's result repeats them (the worker serialises each
    job's audio once instead of twice), a whole-file job's included: its one item is on /stream only. This worker runs
    the SDK's own job loop (TTS_FEATURES=-runpod_pickup), the other tests' worker ours."""
    queue = JobQueue().start()
    queue.submit("stream", {"input": "Streamed once.", "seed": 1, "response_format": "pcm", "stream": True})
    queue.submit("whole", {"input": "A whole file.", "seed": 2, "response_format": "wav"})
    proc = start_worker(tmp_path, {**queue.env(), "RUNPOD_AGGREGATE_STREAM": "off", "TTS_FEATURES": "-runpod_pickup",
                                   "RUNPOD_DEBUG_LEVEL": "DEBUG"})  # the SDK's older name, asked for: its level
    try:
        queue.wait_done(["stream", "whole"], timeout=120)
        *pieces, done = queue.streamed["stream"]
        assert done["done"] and pieces and sum(len(base64.b64decode(p["audio"])) for p in pieces) == done["bytes"]
        (whole,) = queue.streamed["whole"]
        wav = base64.b64decode(whole["audio"])
        assert wav[:4] == b"RIFF" and whole["bytes"] == len(wav)
        for job in ("stream", "whole"):
            assert queue.done[job].get("output") in (None, []), queue.done[job]
        worker_log = (tmp_path / "worker.log").read_text()
        assert "job pickup: the SDK's own loop" in worker_log
        assert "Log level set to DEBUG" in worker_log and "Intermediate results sent." in worker_log
    finally:
        stop_worker(proc)
        queue.stop()


def test_sigterm_cuts_a_job_past_the_drain_deadline_with_an_error_item(tmp_path):
    # RunPod's SDK waits for running jobs without a limit and RunPod kills the container after its grace period:
    # a job still running then would end without a word. TTS_DRAIN_SECONDS bounds the wait; the cut job's last
    # item is an error with status 503 (the job's result: failed, retry it), and the worker exits 0
    queue = JobQueue().start()
    queue.submit("cut", {"text": "Long. " * 40, "stream": True, "max_new_tokens": 3000, "seed": 1})
    proc = start_worker(tmp_path, {**queue.env(), "TTS_DRAIN_SECONDS": "2"})
    try:
        queue.wait_streamed("cut", 1, timeout=120)
        t0 = time.monotonic()
        assert stop_worker(proc) == 0
        assert time.monotonic() - t0 < 20  # 2 s of drain, not the ~3000 frames the job asked for
        queue.wait_done(["cut"], timeout=10)
        err = json.loads(queue.done["cut"]["error"])  # the job fails with the reason (RunPod: FAILED, retry)
        assert err["status"] == 503 and "shut down" in err["error_message"], err
        assert len(queue.streamed["cut"]) > 1 and all("audio" in item for item in queue.streamed["cut"])
        assert "the jobs in flight get up to 2 s" in (tmp_path / "worker.log").read_text()
    finally:
        stop_worker(proc)
        queue.stop()


def test_worker_concurrency_override_and_bad_config(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "handlers", "runpod"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **WORKER_ENV, "RUNPOD_CONCURRENCY": "-1"}, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "RUNPOD_CONCURRENCY" in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "handlers", "runpod"], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, **WORKER_ENV, "TTS_MODEL_DIR": str(tmp_path)}, timeout=60)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr and "config.json" in missing.stderr

    queue = JobQueue().start()
    for i in range(3):
        queue.submit(f"j{i}", {"text": f"Job {i}.", "max_new_tokens": 4})
    # a fresh "volume": the model is fetched from TTS_MODEL_SOURCE before the worker takes jobs
    volume_model = tmp_path / "volume" / "models" / "s1"
    proc = start_worker(tmp_path, {**queue.env(), "RUNPOD_CONCURRENCY": "1", "TTS_MODEL_DIR": str(volume_model),
                                   "TTS_MODEL_SOURCE": str(complete_model(tmp_path / "source"))})
    try:
        queue.wait_done(["j0", "j1", "j2"], timeout=120)
        assert all(len(ids) == 1 for _, ids in queue.taken), queue.taken
        assert all("audio" in queue.done[j]["output"][0] for j in ("j0", "j1", "j2"))
        assert (volume_model / "codec_config.json").is_file()
    finally:
        stop_worker(proc)
        queue.stop()


# ---- RunPod's local test API ------------------------------------------------------------------------
def test_local_test_api_runsync_run_and_status(tmp_path):
    port = free_port()
    proc = start_worker(tmp_path, {}, "--rp_serve_api", "--rp_api_port", str(port), "--rp_api_host", "127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            try:
                r = httpx.post(url + "/runsync", json={"input": {"text": "Local API.", "seed": 6}}, timeout=60)
                break
            except httpx.HTTPError:
                assert time.time() < end, "the local API did not come up"
                time.sleep(0.5)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "COMPLETED", body
        (item,) = body["output"]
        assert base64.b64decode(item["audio"])[:4] == b"RIFF" and item["seed"] == 6

        job = httpx.post(url + "/run", json={"input": {"input": "Queued.", "stream": True}}, timeout=30).json()
        status = httpx.post(f"{url}/status/{job['id']}", timeout=60).json()
        assert status["status"] == "COMPLETED" and status["output"][-1]["done"] is True

        bad = httpx.post(url + "/runsync", json={"input": {"text": ""}}, timeout=30).json()
        assert json.loads(bad["output"][0]["error"])["status"] == 400
    finally:
        stop_worker(proc)


# ---- RunPod Hub files ---------------------------------------------------------------------------------
def test_hub_files_follow_the_conventions_and_their_inputs_are_valid():
    from ttsengine.config import ENV_VARS
    from ttsengine.serving.protocol import job_from_body

    hub = json.loads((ROOT / ".runpod" / "hub.json").read_text())
    tests = json.loads((ROOT / ".runpod" / "tests.json").read_text())
    assert hub["type"] == "serverless" and hub["config"]["runsOn"] == "GPU" and hub["title"] and hub["description"]
    known = set(ENV_VARS)
    for env in hub["config"]["env"]:
        assert env["key"] in known, env["key"]
        assert {"name", "type", "description", "default"} <= set(env["input"]), env
    for preset in hub["config"]["presets"]:
        assert set(preset["defaults"]) <= known
    assert {e["key"] for e in tests["config"]["env"]} <= known
    assert tests["config"]["gpuCount"] == 1 and tests["tests"]
    for t in tests["tests"]:
        body = {k: v for k, v in t["input"].items() if k not in rp.OPTIONS}
        job_from_body(body, None, check_only=True)  # raises on a field the worker would reject
        assert t["timeout"] >= 60_000  # milliseconds: a cold start downloads and compiles
    assert "handlers.runpod.worker" in (ROOT / ".runpod" / "handler.py").read_text()


def test_a_job_refused_for_capacity_waits_for_room_instead_of_failing(tmp_path, monkeypatch):
    # goodput admission (TTS_ADMIT_RTF=100: no CPU step is fast enough) refuses a new stream while another runs; a
    # RunPod job would then fail, though RunPod's queue is where it should wait: the handler retries until room comes
    # (the running stream ends) or CAPACITY_WAIT_S passes, then fails with the 503
    from ttsengine import EngineConfig, Fleet

    fleet = Fleet.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, admit_rtf=100,
                                    default_max_new_tokens=16))
    try:
        assert fleet.wait_all(60)
        handler = rp.JobHandler(fleet, None, RunPodConfig(data_dir=tmp_path))
        playing = fleet.submit(SynthesisRequest(text="Long.", seed=1, max_new_tokens=3000), ignore_stop=True)
        engine = fleet.engines[0]
        deadline = time.monotonic() + 60
        while not engine.budget.step_seconds:  # its decode steps timed: the next stream is refused
            assert time.monotonic() < deadline
            time.sleep(0.01)
        monkeypatch.setattr(rp, "CAPACITY_WAIT_S", 0.5)
        (refused,) = run_job(handler, {"text": "Refused.", "seed": 2})
        assert error_of(refused)["status"] == 503 and "at capacity" in error_of(refused)["error_message"]
        monkeypatch.setattr(rp, "CAPACITY_WAIT_S", 60.0)
        threading.Timer(1.0, playing.cancel).start()  # room comes a second later
        t0 = time.monotonic()
        (item,) = run_job(handler, {"text": "Waited.", "seed": 3})
        assert "audio" in item and time.monotonic() - t0 >= 0.9, item
        assert base64.b64decode(item["audio"])[:4] == b"RIFF"
    finally:
        fleet.close()
