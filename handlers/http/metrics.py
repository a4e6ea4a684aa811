"""/metrics through prometheus_client, one registry per app (several apps in one process never collide):
- the Instrument middleware: HTTP requests by method, route template and status code, in flight, and their
  duration; for a speech request (respond() calls watch_speech) also its first audio (and the stages on its way),
  duration, real-time factor, queue wait and audio seconds, labelled by route, outcome, format, voice kind and
  engine device;
- EngineCollector: the engines' own stats (Service.stats()), read at scrape time, per engine where they have
  one entry each;
- GpuCollector: utilisation, memory and power from NVML where nvidia-ml-py and a GPU are present;
- with TTS_TRACE_CHUNKS=on only (ttsengine.serving.chunk_trace): each audio piece's stages from the engine to the
  transport (tts_trace_chunk_seconds by stage) and the process's CPU seconds per thread role
  (tts_trace_thread_cpu_seconds_total), for finding where the time goes under load;
- LiveMetrics (ttsengine/serving/live/metrics.py): the live WebSockets' sessions, segments, per-segment first
  audio and barge-in.
Labels are bounded: route templates (never a raw path), voice kinds (never a voice id).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from ttsengine import EngineStats, Stream
from ttsengine.serving import chunk_trace
from ttsengine.serving.delivery import Tally
from ttsengine.serving.live.metrics import LiveMetrics
from ttsengine.serving.protocol import SpeechJob
from ttsengine.serving.service import Service

from .thread_cpu import thread_cpu

log = logging.getLogger("handlers.http")
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
SCOPE_KEY = "tts.exchange"  # the ASGI scope entry holding a request's Exchange

SPEECH_LABELS = ("route", "status", "format", "voice", "device")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RTF_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)


# ---- one request's account ---------------------------------------------------------------------------------
@dataclass
class Speech:
    """What respond() tells the middleware about a speech request: its labels, its stream and its delivery."""

    format: str
    voice: str  # default | stored | inline
    stream: Stream
    tally: Tally
    admitted_at: float = field(default_factory=time.perf_counter)  # the engine took it (made right after admit())


@dataclass
class Exchange:
    accepted_at: float  # time.perf_counter() when the middleware saw the request
    route: str = "unmatched"  # known once the router has matched
    status: int | None = None
    first_audio_at: float | None = None  # the first audio bytes handed to the server
    complete: bool = False  # the last body message went out
    speech: Speech | None = None

    def outcome(self) -> str:
        """ok | error | cancelled (the client went away, or the response stopped before its end)."""
        ended = self.speech.tally.outcome
        if ended == "error" or self.status is None:  # no status: the app raised (the server answers 500)
            return "error"
        if self.status == 499 or ended == "cancelled" or not self.complete:
            return "cancelled"
        return "ok" if self.status < 400 else "error"


def voice_kind(job: SpeechJob) -> str:
    """default (the model's own voice) | stored (a saved voice: its codes) | inline (reference audio in the body)."""
    refs = job.request.references
    if not refs:
        return "default"
    return "stored" if all(r.codes is not None for r in refs) else "inline"


def watch_speech(request, job: SpeechJob, stream: Stream) -> Tally:
    """-> the Tally to hand to the delivery (audio_bytes, sse_events, whole); the middleware reads it, with the
    job's labels, when the request ends."""
    tally = Tally()
    exchange = request.scope.get(SCOPE_KEY)
    if exchange is not None:
        exchange.speech = Speech(job.format, voice_kind(job), stream, tally)
    return tally


def route_of(scope) -> str:
    """The route template the router matched (FastAPI puts it in the scope), or "unmatched": no route matched (a
    404, a 405) or the request was answered before routing (the body limit's 413 and 408)."""
    return getattr(scope.get("route"), "path", "unmatched")


# ---- the app's metrics -------------------------------------------------------------------------------------
class HttpMetrics:
    def __init__(self, service: Service):
        self.registry = r = CollectorRegistry()
        http = ("method", "route", "code")
        self.requests = Counter("tts_http_requests_total", "HTTP requests by method, route and status code.", http,
                                registry=r)
        self.errors = Counter("tts_http_errors_total", "HTTP responses with status >= 400.", http, registry=r)
        # no route label: the route is known only once the router has matched, inside the app
        self.in_flight = Gauge("tts_http_requests_in_flight", "HTTP requests being answered now.", registry=r)
        self.duration = Histogram("tts_http_request_duration_seconds",
                                  "Request accepted to the last byte of the response.", http,
                                  buckets=DURATION_BUCKETS, registry=r)
        self.first_audio = Histogram("tts_speech_first_audio_seconds",
                                     "Speech request accepted to its first audio bytes sent.", SPEECH_LABELS,
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.speech_duration = Histogram("tts_speech_duration_seconds",
                                         "Speech request accepted to the end of its response.", SPEECH_LABELS,
                                         buckets=DURATION_BUCKETS, registry=r)
        self.rtf = Histogram("tts_speech_real_time_factor",
                             "Audio seconds delivered / wall seconds of the request (above 1: faster than real "
                             "time); completed requests only.", SPEECH_LABELS, buckets=RTF_BUCKETS, registry=r)
        self.first_audio_stage = Histogram("tts_speech_first_audio_stage_seconds",
                                           "Speech request accepted to a stage on the way to its first audio "
                                           "(requests with first audio only): admitted = the engine took it "
                                           "(planned; with the engine process, its round trip), started = its "
                                           "first prefill, emitted = its first audio chunk reached this process; "
                                           "with the engine process also received = its submit read there, "
                                           "planned = the engine there took it, engine_audio = its first chunk "
                                           "left the codec there.", ("stage",),
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("tts_speech_queue_wait_seconds",
                                    "Submitted to the engine until its first prefill (waiting for a slot); a "
                                    "request that never got one (the client left, an error): until it ended.",
                                    SPEECH_LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.audio_seconds = Counter("tts_speech_audio_seconds_total", "Seconds of audio delivered.",
                                     SPEECH_LABELS, registry=r)
        self.loop_lag = Histogram("tts_event_loop_lag_seconds", "How late the event loop woke a timer due every "
                                  "0.1 s: time every socket's bytes and live messages waited for the loop.",
                                  buckets=LAG_BUCKETS, registry=r)
        self.live = LiveMetrics(r)
        self.chunk = None
        if chunk_trace.enabled():
            self.chunk = Histogram("tts_trace_chunk_seconds", "Per audio piece (TTS_TRACE_CHUNKS=on): wake = engine "
                                   "emitted -> event loop took it, encode = -> encoded, send = -> written to the "
                                   "transport, total = emitted -> written.", ("stage",),
                                   buckets=chunk_trace.BUCKETS, registry=r)
            r.register(ThreadCpuCollector())
        r.register(EngineCollector(service))
        r.register(GpuCollector())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def sent(self, marks) -> None:
        """One body message went out: the oldest traced piece's stages (tracing on, a piece waiting)."""
        if self.chunk is not None and marks:
            for stage, seconds in zip(chunk_trace.STAGES, chunk_trace.stages(*marks.popleft(), time.perf_counter())):
                self.chunk.labels(stage).observe(seconds)

    def responded(self, method: str, route: str, status: int) -> None:
        labels = (method, route, str(status))
        self.requests.labels(*labels).inc()
        if status >= 400:
            self.errors.labels(*labels).inc()

    def ended(self, method: str, ex: Exchange) -> None:
        end = time.perf_counter()
        wall = end - ex.accepted_at
        self.duration.labels(method, ex.route, str(ex.status or 500)).observe(wall)
        sp = ex.speech
        if sp is None:
            return
        status = ex.outcome()
        labels = (ex.route, status, sp.format, sp.voice, sp.stream.device or "unknown")
        self.speech_duration.labels(*labels).observe(wall)
        if ex.first_audio_at is not None:
            self.first_audio.labels(*labels).observe(ex.first_audio_at - ex.accepted_at)
            stream = sp.stream
            # the waterfall, each stage from the request's acceptance: what this path knows of it (marks: the
            # engine process's own stages)
            stages = {**stream.marks, "admitted": sp.admitted_at, "started": stream.started_at,
                      "emitted": stream.first_audio_at}
            for stage, at in stages.items():
                if at is not None:
                    self.first_audio_stage.labels(stage).observe(at - ex.accepted_at)
        if status == "ok" and sp.tally.audio_seconds > 0 and wall > 0:
            self.rtf.labels(*labels).observe(sp.tally.audio_seconds / wall)
        self.queue_wait.labels(*labels).observe(sp.stream.waited(end))  # a request that left the queue too
        self.audio_seconds.labels(*labels).inc(sp.tally.audio_seconds)


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Instrument:
    """ASGI middleware: counts responses by method, route template and status (at the response's start), keeps
    the in-flight gauge, and when the request ends observes its duration (and a speech request's histograms)."""

    def __init__(self, app, metrics: HttpMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # h11 (plain uvicorn) accepts any method token: an unknown one is "other", or each would be a new series
        method = scope["method"] if scope["method"] in METHODS else "other"
        ex = Exchange(time.perf_counter())
        scope[SCOPE_KEY] = ex

        async def watching_send(message):
            if message["type"] == "http.response.start":
                ex.status, ex.route = message["status"], route_of(scope)
                self.metrics.responded(method, ex.route, ex.status)
            await send(message)
            if message["type"] == "http.response.body":
                sp = ex.speech
                if sp is not None and sp.tally.marks and message.get("body"):
                    self.metrics.sent(sp.tally.marks)
                if (ex.first_audio_at is None and sp is not None and message.get("body")
                        and sp.tally.first_audio_at is not None and ex.status < 400):
                    ex.first_audio_at = time.perf_counter()
                if not message.get("more_body", False):
                    ex.complete = True

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, watching_send)
        finally:
            self.metrics.in_flight.dec()
            if ex.status is None:  # raised before answering: the server's error handler sends a 500
                ex.route = route_of(scope)
                self.metrics.responded(method, ex.route, 500)
            try:
                self.metrics.ended(method, ex)
            except Exception:  # noqa: BLE001 - a metrics bug must not turn into a failed request
                log.exception("recording the request's metrics failed")


# ---- collectors read at scrape time ------------------------------------------------------------------------
ENGINE_GAUGES = (  # name, value (read from the stats), help: the engines summed
    ("tts_queue_depth", lambda s: s.waiting, "requests waiting for a stream slot"),
    ("tts_active_streams", lambda s: s.running, "streams generating now"),
    ("tts_frames_per_second", lambda s: s.frames_per_second, "frames generated per second (last 10 s)"),
    ("tts_warmup_seconds", lambda s: s.warmup_seconds, "engine warm-up (compile, graph capture) at start"),
    ("tts_gpu_memory_allocated_bytes", lambda s: s.gpu_memory_allocated_bytes, "GPU memory allocated by torch"),
    ("tts_gpu_memory_reserved_bytes", lambda s: s.gpu_memory_reserved_bytes, "GPU memory reserved by torch"),
    ("tts_max_streams", lambda s: s.max_streams, "streams decoded together at most (the memory preset's batch)"),
    ("tts_kv_cache_positions", lambda s: s.kv_positions, "positions in the paged KV cache"),
)
ENGINE_COUNTERS = (
    ("tts_frames_total", lambda s: s.frames, "frames generated"),
    ("tts_requests_completed_total", lambda s: s.requests_done, "requests completed"),
    ("tts_requests_cancelled_total", lambda s: s.cancelled, "requests cancelled (the client went away)"),
    ("tts_requests_rejected_total", lambda s: s.rejected, "requests refused because every engine was full"),
    ("tts_requests_refused_capacity_total", lambda s: s.refused_capacity,
     "engine refusals by goodput admission: one more stream would have slowed the streams below TTS_ADMIT_RTF x "
     "real time"),
    ("tts_references_encoded_total", lambda s: s.references_encoded,
     "reference audio clips run through the codec's encoder (the encoded-reference cache missed)"),
)
PER_ENGINE = (  # name, value, type, help: one series per engine, labelled with its index and device
    ("tts_engine_up", lambda s: int(s.state == "ready"), "gauge",
     "1 while the engine serves (0: loading, failed or taken out of service)"),
    ("tts_engine_active_streams", lambda s: s.running, "gauge", "streams generating now on this engine"),
    ("tts_engine_queue_depth", lambda s: s.waiting, "gauge", "requests waiting for a slot on this engine"),
    ("tts_engine_frames_per_second", lambda s: s.frames_per_second, "gauge",
     "frames generated per second (last 10 s)"),
    ("tts_engine_gpu_memory_allocated_bytes", lambda s: s.gpu_memory_allocated_bytes, "gauge",
     "GPU memory allocated by torch"),
    ("tts_engine_max_streams", lambda s: s.max_streams, "gauge", "the engine's stream slots"),
    ("tts_engine_frames_total", lambda s: s.frames, "counter", "frames generated"),
    ("tts_engine_requests_completed_total", lambda s: s.requests_done, "counter", "requests completed"),
    ("tts_engine_errors_total", lambda s: s.failed_streams, "counter",
     "requests ended by an engine error (a failed step, the engine taken out of service)"),
    ("tts_engine_prefill_tokens_total", lambda s: s.prefill_tokens, "counter",
     "prompt positions prefilled (a prefix-cache hit's cached positions not counted)"),
    ("tts_engine_prefix_hits_total", lambda s: s.prefix_hits, "counter",
     "requests whose prompt prefix was in the prefix cache"),
    ("tts_engine_prefix_misses_total", lambda s: s.prefix_misses, "counter",
     "requests with a shareable prompt prefix that was not cached (prefilled, then cached)"),
    ("tts_engine_prefix_tokens_saved_total", lambda s: s.prefix_tokens_saved, "counter",
     "prompt positions prefix-cache hits read from cached pages instead of prefilling"),
    ("tts_engine_prefix_evictions_total", lambda s: s.prefix_evictions, "counter",
     "cached prefixes evicted (least recently used) to make room"),
    ("tts_engine_prefix_cached_pages", lambda s: s.prefix_cached_pages, "gauge", "KV pages the prefix cache holds"),
    ("tts_engine_loop_seconds_total", lambda s: s.loop_seconds, "counter",
     "seconds the engine loop spent in iterations, waits for the GPU included"),
    ("tts_engine_step_wait_seconds_total", lambda s: s.step_wait_seconds, "counter",
     "of those, seconds the loop waited for launched decode steps to finish; the rest is host work (Python, "
     "launches, graphs captured at first use): near the wall time the host, not the GPU, sets the pace"),
)


class EngineCollector:
    """The service's readiness and the engines' stats (counters they keep themselves), read at each scrape."""

    def __init__(self, service: Service):
        self.service = service

    def collect(self):
        svc = self.service
        yield GaugeMetricFamily("tts_ready", "1 when the model is loaded and warmed up.", value=int(svc.ready))
        stats = svc.stats()
        if stats is None:
            return
        total = stats.total
        for name, read, help_ in ENGINE_GAUGES:
            if read(total) is not None:
                yield GaugeMetricFamily(name, help_ + ".", value=float(read(total)))
        for name, read, help_ in ENGINE_COUNTERS:
            yield CounterMetricFamily(name, help_ + ".", value=float(read(total)))
        preset = total.memory_preset
        yield InfoMetricFamily("tts_engine", "Quantization, kernel cache, precompiled units, compile, CUDA graphs, "
                               "memory preset.", value={
                                   "quantization": str(total.quantization),
                                   "kernel_cache": str(total.kernel_cache),
                                   "precompiled": str(total.precompiled),
                                   "compiled": str(total.compiled),
                                   "cuda_graphs": str(total.cuda_graphs),
                                   "memory_preset": preset.name if preset is not None else ""})
        yield from per_engine(stats.engines)
        yield engine_ttfa(total)


def per_engine(engines: Sequence[EngineStats]):
    for name, read, kind, help_ in PER_ENGINE:
        family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, help_ + ".",
                                                                                 labels=("engine", "device"))
        for i, e in enumerate(engines):
            value = read(e)
            if value is not None:
                family.add_metric((str(i), e.device), float(value))
        yield family


def engine_ttfa(stats: EngineStats) -> HistogramMetricFamily:
    """The engines' own first-audio histogram (submit to the first audio chunk, inside the engine)."""
    buckets, total = [], 0
    for bound, n in zip(stats.ttfa_buckets, stats.ttfa_counts):
        total += n
        buckets.append((str(float(bound)), total))
    buckets.append(("+Inf", total + stats.ttfa_counts[-1]))
    return HistogramMetricFamily("tts_time_to_first_audio_seconds", "Submit to first audio chunk, in the engine.",
                                 buckets=buckets, sum_value=float(stats.ttfa_sum))


class ThreadCpuCollector:
    """The server process's CPU seconds per thread role (TTS_TRACE_CHUNKS=on only), read at each scrape."""

    def collect(self):
        family = CounterMetricFamily("tts_trace_thread_cpu_seconds", "CPU seconds of this process's threads by "
                                     "role (Python thread name less its number; other: threads Python did not "
                                     "start).", labels=("thread",))
        for name, seconds in sorted(thread_cpu().items()):
            family.add_metric((name,), seconds)
        yield family


class GpuCollector:
    """Utilisation, memory and power of each GPU NVML sees (label `gpu`: NVML's index), from nvidia-ml-py; no
    series at all where the package, the driver or a GPU is missing. A reading a GPU does not support is left
    out."""

    def __init__(self):
        self._nv, self._handles = None, []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nv = pynvml
        except Exception as e:  # noqa: BLE001 - no package, no driver, no GPU: no GPU series
            log.debug("no NVML metrics: %s", e)

    def collect(self):
        if not self._handles:
            return
        nv = self._nv
        families = (
            (GaugeMetricFamily("tts_gpu_utilization_ratio", "Time a kernel ran on the GPU, over NVML's last "
                               "sample period (0-1).", labels=("gpu",)),
             lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100),
            (GaugeMetricFamily("tts_gpu_memory_used_bytes", "GPU memory in use (every process).", labels=("gpu",)),
             lambda h: nv.nvmlDeviceGetMemoryInfo(h).used),
            (GaugeMetricFamily("tts_gpu_memory_total_bytes", "GPU memory in all.", labels=("gpu",)),
             lambda h: nv.nvmlDeviceGetMemoryInfo(h).total),
            (GaugeMetricFamily("tts_gpu_power_watts", "GPU power draw.", labels=("gpu",)),
             lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000),
        )
        for family, read in families:
            for i, handle in enumerate(self._handles):
                with contextlib.suppress(nv.NVMLError):  # not supported by this GPU
                    family.add_metric((str(i),), float(read(handle)))
            yield family
