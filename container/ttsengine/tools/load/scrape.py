"""The server's side of a level, from its /metrics read before and after: each speech histogram's count, mean
and p50/p95 over the level (from the bucket counts, interpolated as Prometheus' histogram_quantile does), the
engine loop's seconds and their host part, and, when the server traces (TTS_TRACE_CHUNKS=on), the chunk stages
and the CPU seconds per server thread."""

from __future__ import annotations

import math
from collections import defaultdict

HISTOGRAMS = {  # our name: the metric (summed over its labels), or (metric, label, value)
    "queue_wait": "tts_speech_queue_wait_seconds",
    "engine_first_audio": "tts_time_to_first_audio_seconds",
    "first_received": ("tts_speech_first_audio_stage_seconds", "stage", "received"),  # -> in the engine process
    "first_planned": ("tts_speech_first_audio_stage_seconds", "stage", "planned"),  # -> the engine there took it
    "first_admitted": ("tts_speech_first_audio_stage_seconds", "stage", "admitted"),  # accepted -> engine took it
    "first_started": ("tts_speech_first_audio_stage_seconds", "stage", "started"),  # -> its first prefill
    "first_engine_audio": ("tts_speech_first_audio_stage_seconds", "stage", "engine_audio"),  # -> codec's chunk
    "first_emitted": ("tts_speech_first_audio_stage_seconds", "stage", "emitted"),  # -> first chunk in the front
    "first_byte_sent": "tts_speech_first_audio_seconds",
    "chunk_wake": ("tts_trace_chunk_seconds", "stage", "wake"),
    "chunk_encode": ("tts_trace_chunk_seconds", "stage", "encode"),
    "chunk_send": ("tts_trace_chunk_seconds", "stage", "send"),
    "chunk_total": ("tts_trace_chunk_seconds", "stage", "total"),
    "loop_lag": "tts_event_loop_lag_seconds",  # how late the server's event loop woke a 0.1 s timer
    "live_first_audio": "tts_live_segment_first_audio_seconds",  # a live segment's text complete -> its first audio
    "live_first_segment": ("tts_live_segment_first_audio_seconds", "segment", "first"),  # of a session's first one
    "live_barge_in": "tts_live_barge_in_seconds",  # a live barge-in -> the engine's slot freed
    "live_submit_thread": ("tts_live_segment_submit_seconds", "stage", "thread"),  # -> a thread submits it
    "live_submit_taken": ("tts_live_segment_submit_seconds", "stage", "taken"),  # -> the engine took it
}
COUNTERS = {"engine_loop_s": "tts_engine_loop_seconds_total",
            "engine_step_wait_s": "tts_engine_step_wait_seconds_total", "frames": "tts_frames_total"}
THREADS = "tts_trace_thread_cpu_seconds_total"


def read(url: str, timeout: float = 10.0) -> dict | None:
    """-> {(sample name, labels as a sorted tuple): value}, or None when /metrics cannot be read."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=timeout).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}
    except Exception:  # noqa: BLE001 - no breakdown then, the client's figures stand alone
        return None


def _summed(samples: dict, name: str, where: tuple | None = None) -> dict:
    """name's samples summed over their labels, keyed by `le` (buckets) or None (a plain sample)."""
    out = defaultdict(float)
    for (n, labels), v in samples.items():
        d = dict(labels)
        if n == name and (where is None or d.get(where[0]) == where[1]):
            out[d.get("le")] += v
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """buckets: (upper bound, cumulative count) in order, +Inf last -> the q quantile (nan: no observations)."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the open top bucket: its lower edge, as Prometheus answers
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def _histogram(before: dict, after: dict, spec) -> dict | None:
    name, where = (spec, None) if isinstance(spec, str) else (spec[0], spec[1:])
    d = {}
    for suffix in ("_bucket", "_sum", "_count"):
        a, b = _summed(after, name + suffix, where), _summed(before, name + suffix, where)
        d[suffix] = {k: a[k] - b.get(k, 0.0) for k in a}
    count = d["_count"].get(None, 0.0)
    if not d["_bucket"]:
        return None
    buckets = sorted((float(le), n) for le, n in d["_bucket"].items())
    mean = d["_sum"].get(None, 0.0) / count if count else math.nan
    return {"count": int(count), "mean_ms": mean * 1000, "p50_ms": quantile(buckets, 0.5) * 1000,
            "p95_ms": quantile(buckets, 0.95) * 1000}


def breakdown(before: dict | None, after: dict | None) -> dict:
    """The level's server figures (empty when either read failed)."""
    if before is None or after is None:
        return {}
    out = {}
    for key, spec in HISTOGRAMS.items():
        h = _histogram(before, after, spec)
        if h is not None:
            out[key] = h
    for key, name in COUNTERS.items():
        out[key] = sum(_summed(after, name).values()) - sum(_summed(before, name).values())
    out["engine_host_s"] = out["engine_loop_s"] - out["engine_step_wait_s"]
    threads = {dict(k[1])["thread"]: v - before.get(k, 0.0) for k, v in after.items() if k[0] == THREADS}
    if threads:
        out["thread_cpu_s"] = {k: round(v, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])}
    return out
