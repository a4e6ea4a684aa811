"""The HTTP server with the engines in their own process (TTS_ENGINE_PROCESS=on, the GPU default), for real: the
same tests the one-process server passes, for what crosses the process boundary (every format, a stream as it is
made, disconnect frees the engine, no-audio errors, voices encoded in the engine process, metrics and health, the
drain on SIGTERM, a broken model dir, RunPod's worker loop), plus what only this mode has (the engine process
dies: health says so)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import test_drain
import test_http
import test_runpod
from test_http import FRAMES, scrape, start_server, stop, wait_ready
from test_http_metrics import histogram

ON = {"TTS_ENGINE_PROCESS": "on"}


@pytest.fixture(autouse=True)
def engine_process(monkeypatch):
    for name, value in ON.items():  # start_server passes os.environ on to the server
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("http-ep"), TTS_MAX_UPLOAD_BYTES="300000",
                             TTS_MAX_BODY_BYTES="2000000", **ON)
    wait_ready(url, proc)
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def threaded(tmp_path_factory):
    """The same server with direct_admit off (a front planning thread hands each request over and waits) and
    resample_thread off (pcm's 24 kHz and wav at other rates resampled on the event loop, not on threads)."""
    proc, url = start_server(tmp_path_factory.mktemp("http-ep-threaded"), TTS_FEATURES="-direct_admit,-resample_thread",
                             **ON)
    wait_ready(url, proc)
    yield url
    stop(proc)


@pytest.mark.parametrize("name", ["test_audio_streams_as_it_is_made", "test_sse", "test_same_seed_same_audio",
                                  "test_no_audio_is_a_422_in_every_mode", "test_voices_round_trip",
                                  "test_disconnect_mid_stream_frees_the_engine"])
def test_without_direct_admit_as_in_one_process(threaded, name):
    # direct_admit's off switch: every request through a planning thread (as requests with reference audio always go)
    getattr(test_http, name)(threaded)


@pytest.mark.parametrize("body", [{"response_format": "pcm"}, {"response_format": "wav", "sample_rate": 16000},
                                  {"response_format": "pcm", "sample_rate": 44100}])
def test_resample_thread_writes_the_inline_bytes(server, threaded, body):
    # the same request to both servers: resampled on resampler threads (server, the default) and on the event loop
    # (threaded: the off switches)
    a, b = (httpx.post(url + "/v1/audio/speech", timeout=120, json={"input": "Hello there.", "seed": 5, **body})
            for url in (server, threaded))
    assert a.status_code == b.status_code == 200 and len(a.content) > 1000 and a.content == b.content


@pytest.mark.parametrize("fmt", ["wav", "pcm", "mp3", "opus", "flac", "aac"])
def test_every_format(server, fmt):
    test_http.test_every_format_decodes_to_the_expected_duration(server, fmt)


@pytest.mark.parametrize("name", ["test_audio_streams_as_it_is_made", "test_sse", "test_same_seed_same_audio",
                                  "test_no_audio_is_a_422_in_every_mode", "test_voices_round_trip",
                                  "test_disconnect_mid_stream_frees_the_engine", "test_metrics_and_health",
                                  "test_fish_tts_json_and_msgpack", "test_captioned_speech"])
def test_as_in_one_process(server, name):
    getattr(test_http, name)(server)


@pytest.mark.parametrize("door", ["server", "threaded"])
def test_first_audio_waterfall_crosses_the_process(door, request):
    """The engine process's own stages reach the front's histogram, each request's in the order they happen:
    accepted < received there < planned there < admitted here; received < started (first prefill: the engine loop
    may run it before the planning thread reads its clock) < its first chunk out of the codec there <= here."""
    server = request.getfixturevalue(door)
    stage = lambda samples, st: histogram(samples, "tts_speech_first_audio_stage_seconds", {"stage": st})  # noqa: E731
    names = ("received", "planned", "admitted", "started", "engine_audio", "emitted")
    before = {st: stage(scrape(server), st) for st in names}
    for i in range(3):
        r = httpx.post(server + "/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm",
                                                           "max_new_tokens": FRAMES, "seed": i}, timeout=60)
        assert r.status_code == 200 and r.content, r.text
    end = time.monotonic() + 10
    while stage(scrape(server), "emitted")[0] < before["emitted"][0] + 3 and time.monotonic() < end:
        time.sleep(0.05)  # the middleware observes a request once its response ended
    after = {st: stage(scrape(server), st) for st in names}
    count = {st: after[st][0] - before[st][0] for st in names}
    mean = {st: (after[st][1] - before[st][1]) / 3 for st in names}  # histogram(): (count, sum)
    assert count == dict.fromkeys(names, 3), count
    assert 0 < mean["received"] < mean["planned"] < mean["admitted"], mean
    assert mean["received"] < mean["started"] < mean["engine_audio"] <= mean["emitted"], mean


def test_drain_lets_a_stream_finish(tmp_path):
    test_drain.test_sigterm_lets_a_20_second_stream_finish_and_refuses_new_work(tmp_path)


def test_the_runpod_worker_streams_batches_reports_progress_and_drains(tmp_path):
    # progress counts text chunks while streaming: their reports cross with the audio
    test_runpod.test_worker_loop_streams_batches_reports_progress_and_drains(tmp_path)


def test_the_runpod_worker_streams_a_live_job(tmp_path, engine):
    # the worker's Service admits each segment on its event loop (the engine process plans it); the same audio as
    # a handler on the in-process engine
    import test_runpod_live

    from handlers.runpod import handler as rp
    from ttsengine import RunPodConfig

    test_runpod_live.test_the_worker_loop_streams_a_live_job(tmp_path, rp.JobHandler(engine, None,
                                                                                     RunPodConfig(data_dir=tmp_path)))


def test_both_processes_freeze_their_heaps_before_ready_and_serve_on(tmp_path):
    # feature gc_freeze: the engine process once its start-up captures are in (a settled /ready waits for it), the
    # front once its engine process has loaded; the objects go back at exit (no leak report from native libraries)
    proc, url = start_server(tmp_path, TTS_LOG_LEVEL="INFO")
    try:
        wait_ready(url, proc)
        log = test_http.server_log(proc)
        assert "froze the heap (gc_freeze) on cpu" in log and "froze the front's heap (gc_freeze)" in log
        r = httpx.post(url + "/v1/audio/speech", timeout=120, json={"input": "Hello there.", "response_format": "pcm"})
        assert r.status_code == 200 and len(r.content) > 1000
    finally:
        stop(proc)
    assert "leaked" not in test_http.server_log(proc) and "Traceback" not in test_http.server_log(proc)


def test_a_broken_model_dir_reports_on_ready_and_health(tmp_path):
    test_http.test_broken_model_dir_reports_on_ready_and_health(tmp_path)


def test_the_engine_process_gone_is_a_failed_health_and_503s(tmp_path):
    proc, url = start_server(tmp_path)
    try:
        wait_ready(url, proc)
        engine = _child(proc.pid)
        os.kill(engine, signal.SIGKILL)
        end = time.monotonic() + 30
        while httpx.get(url + "/health", timeout=5).json().get("status") != "failed" and time.monotonic() < end:
            time.sleep(0.1)
        health = httpx.get(url + "/health", timeout=5).json()
        assert health["status"] == "failed" and "engine process exited" in health["error"], health
        r = httpx.post(url + "/v1/audio/speech", json={"input": "Hello."}, timeout=10)
        assert r.status_code == 503 and "engine process exited" in r.json()["error"]["message"], r.text
        assert httpx.get(url + "/ready", timeout=5).status_code == 503
    finally:
        stop(proc)
    assert "Traceback" not in test_http.server_log(proc)


def _child(pid: int) -> int:
    """The engine process: the server's child running engine_process.host."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and b"engine_process.host" in cmd:
                return int(entry)
    raise AssertionError("no engine process under the server")


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    """test_live's server with the engines in their own process: each live segment admitted on the event loop."""
    import test_live

    proc, url = start_server(tmp_path_factory.mktemp("live-ep"), TTS_HOST="127.0.0.1", TTS_API_KEY=test_live.KEY,
                             TTS_LIVE_IDLE_TIMEOUT=str(test_live.IDLE), TTS_LIVE_MAX_CHARS=str(test_live.MAX_CHARS),
                             **ON)
    wait_ready(url, proc)
    yield url
    stop(proc)


@pytest.mark.parametrize("name", ["test_segments_flush_stop_and_a_second_session_on_one_socket",
                                  "test_the_same_seed_gives_the_same_audio",
                                  "test_each_segment_is_spoken_with_the_one_before_as_context",
                                  "test_cancel_is_barge_in_and_the_socket_stays_usable",
                                  "test_closing_the_socket_is_barge_in",
                                  "test_closing_the_socket_while_references_are_encoded_gives_the_segment_up",
                                  "test_an_engine_error_is_a_finish_with_the_message"])
def test_live_sessions_as_in_one_process(live_server, name):
    # a live session's segments go to the engine process as /v1/tts requests do (Service.admit: the event loop hands
    # each over; one with reference audio through a planning thread, given up when the socket closes)
    import test_live

    getattr(test_live, name)(live_server)
