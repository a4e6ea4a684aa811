"""Prometheus text for /metrics: request counts by route and status (counted by the CountRequests middleware),
plus the engine's own stats."""

from __future__ import annotations

import threading
from collections import Counter


class RequestCounter:
    def __init__(self):
        self._counts: Counter[tuple[str, str, int]] = Counter()
        self._lock = threading.Lock()

    def add(self, method: str, route: str, status: int) -> None:
        with self._lock:
            self._counts[(method, route, status)] += 1

    def items(self) -> list[tuple[tuple[str, str, int], int]]:
        with self._lock:
            return sorted(self._counts.items())


class CountRequests:
    """ASGI middleware: counts responses by method, route template and status."""

    def __init__(self, app, counter: RequestCounter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                route = scope.get("route")
                self.counter.add(scope["method"], getattr(route, "path", "unmatched"), message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


def _labels(**kw) -> str:
    return "{" + ",".join(f'{k}="{str(v)}"' for k, v in kw.items()) + "}"


PER_ENGINE = (  # name, stats key, type, help: one series per engine, labelled with its index and device
    ("tts_engine_up", None, "gauge", "1 while the engine serves (0: loading, failed or taken out of service)"),
    ("tts_engine_active_streams", "running", "gauge", "streams generating now on this engine"),
    ("tts_engine_queue_depth", "waiting", "gauge", "requests waiting for a slot on this engine"),
    ("tts_engine_frames_per_second", "frames_per_second", "gauge", "frames generated per second (last 10 s)"),
    ("tts_engine_gpu_memory_allocated_bytes", "gpu_memory_allocated_bytes", "gauge", "GPU memory allocated by torch"),
    ("tts_engine_max_streams", "max_streams", "gauge", "the engine's stream slots"),
    ("tts_engine_frames_total", "frames", "counter", "frames generated"),
    ("tts_engine_requests_completed_total", "requests_done", "counter", "requests completed"),
    ("tts_engine_errors_total", "failed_streams", "counter",
     "requests ended by an engine error (a failed step, the engine taken out of service)"),
)


def _per_engine(engines: list[dict]) -> list[str]:
    lines = []
    for name, key, kind, help_ in PER_ENGINE:
        lines += [f"# HELP {name} {help_}.", f"# TYPE {name} {kind}"]
        for e in engines:
            value = int(e["state"] == "ready") if key is None else e.get(key)
            if value is not None:
                lines.append(f"{name}{_labels(engine=e['index'], device=e['device'])} {float(value)}")
    return lines


def render(counter: RequestCounter, stats: dict | None, ready: bool) -> str:
    lines = ["# HELP tts_http_requests_total HTTP requests by method, route and status code.",
             "# TYPE tts_http_requests_total counter"]
    errors: Counter[tuple[str, str, int]] = Counter()
    for (method, route, status), n in counter.items():
        lines.append(f"tts_http_requests_total{_labels(method=method, route=route, code=status)} {n}")
        if status >= 400:
            errors[(method, route, status)] += n
    lines += ["# HELP tts_http_errors_total HTTP responses with status >= 400.", "# TYPE tts_http_errors_total counter"]
    for (method, route, status), n in sorted(errors.items()):
        lines.append(f"tts_http_errors_total{_labels(method=method, route=route, code=status)} {n}")
    lines += ["# HELP tts_ready 1 when the model is loaded and warmed up.", "# TYPE tts_ready gauge",
              f"tts_ready {int(ready)}"]
    if stats:
        gauges = {
            "tts_queue_depth": ("waiting", "requests waiting for a stream slot"),
            "tts_active_streams": ("running", "streams generating now"),
            "tts_frames_per_second": ("frames_per_second", "frames generated per second (last 10 s)"),
            "tts_warmup_seconds": ("warmup_seconds", "engine warm-up (compile, graph capture) at start"),
            "tts_gpu_memory_allocated_bytes": ("gpu_memory_allocated_bytes", "GPU memory allocated by torch"),
            "tts_gpu_memory_reserved_bytes": ("gpu_memory_reserved_bytes", "GPU memory reserved by torch"),
            "tts_max_streams": ("max_streams", "streams decoded together at most (the memory preset's batch)"),
            "tts_kv_cache_positions": ("kv_positions", "positions in the paged KV cache"),
        }
        for name, (key, help_) in gauges.items():
            if stats.get(key) is not None:
                lines += [f"# HELP {name} {help_}.", f"# TYPE {name} gauge", f"{name} {float(stats[key])}"]
        counters = {"tts_frames_total": "frames", "tts_requests_completed_total": "requests_done",
                    "tts_requests_cancelled_total": "cancelled", "tts_requests_rejected_total": "rejected"}
        for name, key in counters.items():
            lines += [f"# TYPE {name} counter", f"{name} {stats.get(key, 0)}"]
        lines += ["# HELP tts_engine_info Quantization, kernel cache, precompiled units, compile, CUDA graphs, memory "
                  "preset.",
                  "# TYPE tts_engine_info gauge",
                  "tts_engine_info" + _labels(quantization=stats.get("quantization", ""),
                                              kernel_cache=stats.get("kernel_cache", ""),
                                              precompiled=stats.get("precompiled", ""),
                                              compiled=stats.get("compiled", ""),
                                              cuda_graphs=stats.get("cuda_graphs", ""),
                                              memory_preset=(stats.get("memory_preset") or {}).get("name", ""))
                  + " 1"]
        lines += _per_engine(stats.get("engines") or [])
        lines += ["# HELP tts_time_to_first_audio_seconds Submit to first audio chunk.",
                  "# TYPE tts_time_to_first_audio_seconds histogram"]
        total = 0
        for bound, n in zip(stats["ttfa_buckets"], stats["ttfa_counts"]):
            total += n
            lines.append(f'tts_time_to_first_audio_seconds_bucket{{le="{bound}"}} {total}')
        total += stats["ttfa_counts"][-1]
        lines += [f'tts_time_to_first_audio_seconds_bucket{{le="+Inf"}} {total}',
                  f"tts_time_to_first_audio_seconds_sum {stats['ttfa_sum']}",
                  f"tts_time_to_first_audio_seconds_count {total}"]
    return "\n".join(lines) + "\n"
