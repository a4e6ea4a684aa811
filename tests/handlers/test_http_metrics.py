"""/metrics through prometheus_client: the real server (tiny model on CPU) answers speech requests of several
formats, voice kinds and routes, and one the client leaves; the scrape, parsed, has one observation per request in
each speech histogram under the right labels, the real-time factor matches the audio and the wall time, first audio
comes before the end. In process: each app has its own registry; the NVML series from a stand-in pynvml, and none
without one; a request's outcome and voice kind."""

from __future__ import annotations

import base64
import sys
import time
import types

import httpx
import pytest
from conftest import ROOT
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_http import FRAME_S, FRAMES, duration, scrape, start_server, stop, wait_ready, wav_bytes
from test_http_app import FakeEngine, client, settle

from handlers.http.metrics import Exchange, GpuCollector, Speech, voice_kind
from ttsengine import SynthesisRequest
from ttsengine.serving.delivery import Tally
from ttsengine.serving.protocol import SpeechJob
from ttsengine.synthesis.request import Reference

SPEECH, TTS = "/v1/audio/speech", "/v1/tts"
HISTOGRAMS = ("tts_speech_duration_seconds", "tts_speech_first_audio_seconds", "tts_speech_real_time_factor",
              "tts_speech_queue_wait_seconds")
AUDIO_S = (FRAMES - 1) * FRAME_S  # what one request of the test server says


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("metrics"))
    wait_ready(url, proc)
    yield url
    stop(proc)


def labels(route: str, status: str, fmt: str, voice: str) -> dict:
    return {"route": route, "status": status, "format": fmt, "voice": voice, "device": "cpu"}


def histogram(samples, name: str, want: dict) -> tuple[float, float]:
    """(count, sum) of the series of `name` with exactly these labels; (0, 0) when it has none."""
    count = [s.value for s in samples if s.name == name + "_count" and s.labels == want]
    total = [s.value for s in samples if s.name == name + "_sum" and s.labels == want]
    assert len(count) <= 1
    return (count[0], total[0]) if count else (0.0, 0.0)


def value(samples, name: str, want: dict) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == want]
    assert len(found) == 1, f"{name}{want}: {found}"
    return found[0]


def test_speech_requests_are_observed_with_their_labels(server):
    r = httpx.post(server + "/v1/references/add", data={"id": "metricvoice", "text": "noise"},
                   files={"audio": ("a.wav", wav_bytes())}, timeout=60)
    assert r.status_code == 201, r.text
    pcm = httpx.post(server + SPEECH, json={"input": "A longer sentence to stream.", "seed": 2, "max_new_tokens": 200,
                                            "response_format": "pcm"}, timeout=120)  # streamed, the model's own voice
    mp3 = httpx.post(server + SPEECH, json={"input": "Hello there.", "seed": 1, "response_format": "mp3",
                                            "stream": False, "voice": "metricvoice"}, timeout=120)  # whole, stored
    wav = httpx.post(server + TTS, json={"text": "Hello there.", "seed": 1, "format": "wav", "references": [
        {"audio": base64.b64encode(wav_bytes()).decode(), "text": "noise"}]}, timeout=120)  # fish route, inline
    sse = httpx.post(server + SPEECH, json={"input": "Hello there.", "seed": 1, "response_format": "wav",
                                            "stream_format": "sse", "speed": 2.0}, timeout=120)
    for resp in (pcm, mp3, wav, sse):
        assert resp.status_code == 200, resp.text
    bad = httpx.post(server + SPEECH, json={"input": "x", "speed": 99})
    assert bad.status_code == 400  # refused before the engine: no speech observation
    # one the client leaves after its first audio (seed 1 with this text runs for ~1000 frames)
    with httpx.stream("POST", server + SPEECH, timeout=120, json={"input": "Long.", "response_format": "pcm",
                                                                  "max_new_tokens": 3000, "seed": 1}) as r:
        chunks = r.iter_raw()
        next(chunks)

    end = time.time() + 20
    while True:
        samples = scrape(server)
        done = sum(s.value for s in samples if s.name == "tts_speech_duration_seconds_count")
        if done >= 5 or time.time() > end:
            break
        time.sleep(0.1)
    assert done == 5  # the 400 and the voice upload are no speech

    ok = {"pcm": labels(SPEECH, "ok", "pcm", "default"), "mp3": labels(SPEECH, "ok", "mp3", "stored"),
          "wav": labels(TTS, "ok", "wav", "inline"), "sse": labels(SPEECH, "ok", "wav", "default")}
    left = labels(SPEECH, "cancelled", "pcm", "default")
    audio = {"pcm": len(pcm.content) / 2 / 24000, "mp3": AUDIO_S, "wav": duration(wav.content, "wav"),
             "sse": AUDIO_S / 2}
    for key, want in ok.items():
        wall_n, wall = histogram(samples, "tts_speech_duration_seconds", want)
        first_n, first = histogram(samples, "tts_speech_first_audio_seconds", want)
        rtf_n, rtf = histogram(samples, "tts_speech_real_time_factor", want)
        wait_n, wait = histogram(samples, "tts_speech_queue_wait_seconds", want)
        seconds = value(samples, "tts_speech_audio_seconds_total", want)
        assert (wall_n, first_n, rtf_n, wait_n) == (1, 1, 1, 1), key
        assert 0 <= wait < first <= wall, key
        assert abs(seconds - audio[key]) < 0.003, key
        assert rtf > 0 and rtf == pytest.approx(seconds / wall, rel=1e-9), key
    assert histogram(samples, "tts_speech_first_audio_seconds", ok["pcm"])[1] < \
        0.9 * histogram(samples, "tts_speech_duration_seconds", ok["pcm"])[1]  # streamed: audio well before the end
    assert histogram(samples, "tts_speech_duration_seconds", left)[0] == 1
    assert histogram(samples, "tts_speech_first_audio_seconds", left)[0] == 1  # it got its first audio
    assert histogram(samples, "tts_speech_real_time_factor", left)[0] == 0  # completed requests only
    for name in HISTOGRAMS:  # every observation is one of the above: no other label set
        assert sum(s.value for s in samples if s.name == name + "_count") == (4 if "real_time" in name else 5)
    # the stages on the way to each first audio: the engine took it and prefilled it, its first chunk reached the
    # front, then sent (one process: no engine-process stages)
    stages = {st: histogram(samples, "tts_speech_first_audio_stage_seconds", {"stage": st})
              for st in ("admitted", "started", "emitted", "received")}
    sent = sum(s.value for s in samples if s.name == "tts_speech_first_audio_seconds_sum")
    assert stages["admitted"][0] == stages["started"][0] == stages["emitted"][0] == 5
    assert stages["received"][0] == 0
    assert 0 < stages["admitted"][1] < stages["emitted"][1] <= sent
    assert 0 < stages["started"][1] < stages["emitted"][1]

    http = {"method": "POST", "route": SPEECH, "code": "200"}
    assert value(samples, "tts_http_requests_total", http) == 4
    assert value(samples, "tts_http_requests_total", {**http, "route": TTS}) == 1
    assert value(samples, "tts_http_requests_total", {**http, "code": "400"}) == 1
    assert value(samples, "tts_http_errors_total", {**http, "code": "400"}) == 1
    assert value(samples, "tts_http_request_duration_seconds_count", http) == 4
    assert value(samples, "tts_http_requests_in_flight", {}) == 1  # the scrape itself
    assert all("metricvoice" not in v for s in samples for v in s.labels.values())  # voice ids are no label
    assert value(samples, "tts_requests_cancelled_total", {}) == 1  # the engine's own counters still there
    assert value(samples, "tts_engine_up", {"engine": "0", "device": "cpu"}) == 1


# ---- in process --------------------------------------------------------------------------------------------
def test_a_stored_voices_prefix_is_prefilled_once_and_counted(server):
    # a real server: a ~4 s stored voice fills a whole KV page of prompt prefix, so its first request misses and
    # caches it, the next ones hit; /metrics says so, and the prefill counter drops by the cached positions
    r = httpx.post(server + "/v1/references/add", data={"id": "prefixvoice", "text": "some words"},
                   files={"audio": ("v.wav", wav_bytes(4.0, 44100, seed=5))}, timeout=60)
    assert r.status_code == 201, r.text

    def total(samples, name: str) -> float:
        return sum(s.value for s in samples if s.name == name)

    names = ("tts_engine_prefix_hits_total", "tts_engine_prefix_misses_total", "tts_engine_prefix_tokens_saved_total",
             "tts_engine_prefill_tokens_total")
    marks = []
    for _ in range(3):
        marks.append({n: total(scrape(server), n) for n in names})
        resp = httpx.post(server + SPEECH, json={"input": "The same sentence.", "seed": 7, "voice": "prefixvoice",
                                                 "stream": False, "response_format": "wav", "max_new_tokens": 8},
                          timeout=120)
        assert resp.status_code == 200, resp.text
    marks.append({n: total(scrape(server), n) for n in names})
    step = [{n: b[n] - a[n] for n in names} for a, b in zip(marks, marks[1:])]
    assert [(d["tts_engine_prefix_misses_total"], d["tts_engine_prefix_hits_total"]) for d in step] == \
           [(1, 0), (0, 1), (0, 1)]
    saved = step[1]["tts_engine_prefix_tokens_saved_total"]
    assert saved >= 64 and step[2]["tts_engine_prefix_tokens_saved_total"] == saved
    # the same request again prefills exactly the cached positions fewer
    assert step[0]["tts_engine_prefill_tokens_total"] - step[1]["tts_engine_prefill_tokens_total"] == saved
    assert total(scrape(server), "tts_engine_prefix_cached_pages") >= saved // 64


def test_the_engine_loops_time_is_counted(server):
    # a real server: a request runs the engine loop, whose time /metrics counts; on a CPU a step is done when it is
    # launched, so the loop never waits for one (on a GPU the wait is the part the host is idle)
    def total(name: str) -> float:
        return sum(s.value for s in scrape(server) if s.name == name)

    names = {s.name for s in scrape(server)}
    assert {"tts_engine_loop_seconds_total", "tts_engine_step_wait_seconds_total"} <= names  # the series exist
    before = total("tts_engine_loop_seconds_total")
    resp = httpx.post(server + SPEECH, json={"input": "Count the loop.", "seed": 3, "stream": False,
                                             "response_format": "wav", "max_new_tokens": 8}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert total("tts_engine_loop_seconds_total") > before
    assert total("tts_engine_step_wait_seconds_total") == 0


def test_the_event_loops_lag_is_observed(server):
    def count() -> float:
        return next(s.value for s in scrape(server) if s.name == "tts_event_loop_lag_seconds_count")

    before = count()
    time.sleep(0.5)  # the watcher wakes every 0.1 s on the server's loop
    assert count() >= before + 3


def test_each_app_counts_on_its_own_registry(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with client(tmp_path / "a", FakeEngine) as a, client(tmp_path / "b", FakeEngine) as b:
        settle(a)
        settle(b)
        for _ in range(3):
            a.get("/health")
        b.get("/health")
        counts = [[line for line in c.get("/metrics").text.splitlines()
                   if line.startswith("tts_http_requests_total") and 'route="/health"' in line] for c in (a, b)]
    assert counts == [['tts_http_requests_total{code="200",method="GET",route="/health"} 3.0'],
                      ['tts_http_requests_total{code="200",method="GET",route="/health"} 1.0']]
    assert b"tts_" not in generate_latest(REGISTRY)  # nothing on the process-wide registry


def fake_nvml(power_fails_on: int) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def power(handle):
        if handle == power_fails_on:
            raise NVMLError("not supported")
        return 250_000  # milliwatts

    nv.NVMLError = NVMLError
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37 + h)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)
    nv.nvmlDeviceGetPowerUsage = power
    return nv


def gpu_samples() -> dict:
    return {(s.name, s.labels.get("gpu")): s.value for family in GpuCollector().collect() for s in family.samples}


def test_gpu_series_from_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(power_fails_on=1))
    assert gpu_samples() == {
        ("tts_gpu_utilization_ratio", "0"): 0.37, ("tts_gpu_utilization_ratio", "1"): 0.38,
        ("tts_gpu_memory_used_bytes", "0"): 2**30, ("tts_gpu_memory_used_bytes", "1"): 2 * 2**30,
        ("tts_gpu_memory_total_bytes", "0"): 80 * 2**30, ("tts_gpu_memory_total_bytes", "1"): 80 * 2**30,
        ("tts_gpu_power_watts", "0"): 250.0}  # GPU 1 cannot read its power: left out, the rest still there


def test_no_gpu_series_without_nvml(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert gpu_samples() == {}
    broken = fake_nvml(0)

    def no_driver():
        raise broken.NVMLError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert gpu_samples() == {}
    with client(tmp_path, FakeEngine) as c:
        settle(c)
        r = c.get("/metrics")
    assert r.status_code == 200 and "tts_gpu_" not in r.text and "tts_ready 1.0" in r.text


def job(*refs: Reference) -> SpeechJob:
    return SpeechJob(SynthesisRequest("hi", references=refs), "wav", None, 1.0, streaming=True)


def test_a_request_that_left_the_queue_is_observed_with_its_wait():
    # a client that gives up while its request waits for a slot: its wait (to the end) is observed, not dropped
    from conftest import MODEL_DIR

    from handlers.http.metrics import HttpMetrics
    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2), start=False)  # nothing runs
    try:
        stream = eng.submit(SynthesisRequest(text="Queued.", seed=1, max_new_tokens=5))
        time.sleep(0.05)
        stream.cancel()
        metrics = HttpMetrics(None)  # the engine collector is not scraped here
        ex = Exchange(stream.submitted_at, SPEECH, status=200, speech=Speech("pcm", "default", stream,
                                                                             Tally(outcome="cancelled")))
        metrics.ended("POST", ex)
        (family,) = metrics.queue_wait.collect()
        want = labels(SPEECH, "cancelled", "pcm", "default")
        count = [s.value for s in family.samples if s.name.endswith("_count") and s.labels == want]
        total = [s.value for s in family.samples if s.name.endswith("_sum") and s.labels == want]
        assert count == [1] and total[0] >= 0.05
    finally:
        eng.close()


def test_voice_kind():
    assert voice_kind(job()) == "default"
    assert voice_kind(job(Reference("t", codes=[[1]]))) == "stored"
    assert voice_kind(job(Reference("t", audio=b"RIFF"))) == "inline"


@pytest.mark.parametrize(("tally", "status", "complete", "outcome"), [
    ("ok", 200, True, "ok"),
    ("error", 200, False, "error"),  # the stream failed after the headers
    ("error", 200, True, "error"),  # SSE reports it in-band and ends the body
    (None, 200, False, "cancelled"),  # the client left mid-body, the delivery not closed yet
    ("cancelled", 499, True, "cancelled"),  # left while a whole file was being made
    ("ok", 200, False, "cancelled"),  # made, but the client left before the end
    ("ok", 500, True, "error"),
    (None, None, False, "error"),  # the app raised before answering
])
def test_outcome(tally, status, complete, outcome):
    ex = Exchange(0.0, status=status, complete=complete, speech=Speech("wav", "default", None, Tally(outcome=tally)))
    assert ex.outcome() == outcome


def test_every_metric_is_in_the_docs(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(power_fails_on=-1))
    with client(tmp_path, FakeEngine) as c:
        settle(c)
        text = c.get("/metrics").text
    suffix = {"counter": "_total", "info": "_info"}
    names = {f.name + suffix.get(f.type, "") for f in text_string_to_metric_families(text)
             if not f.name.endswith("_created")}  # the library's, described once in the README
    assert {"tts_speech_real_time_factor", "tts_gpu_power_watts", "tts_engine_info"} <= names
    # docs/http-api.md's "Metrics" table, or a page of docs/ (the live sockets' series are in docs/voice-agents.md)
    doc = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    assert sorted(n for n in names if f"`{n}`" not in doc) == []
