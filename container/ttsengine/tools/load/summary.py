"""One level's figures from the client processes' records: requests, latency percentiles, real-time factors,
delivered audio, stalls, and the load generator's own CPU use per process."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Level:
    format: str
    concurrency: int  # closed loop: clients; open loop: the level's requests
    arrivals: str  # closed | poisson:RATE
    processes: int
    requests: int
    errors: int
    wall_s: float
    requests_per_s: float
    chars_per_s: float
    ttfb_p50_ms: float
    ttfb_p95_ms: float
    ttfb_p99_ms: float
    first_audio_p50_ms: float
    first_audio_p95_ms: float
    first_audio_p99_ms: float
    rtf_p50: float
    rtf_p95: float
    audio_s_per_s: float
    stalls: int  # the audio ran dry after playback started (>= 1 ms), all streams
    stalled_streams: int
    stall_s: float  # seconds waited after playback started, all streams
    stall_p95_ms: float  # per stream
    client_cpu_pct: list[float] = field(default_factory=list)  # each client process: CPU seconds / its wall
    send_lag_p95_ms: float | None = None  # open loop: how late the generator sent (its own backlog)
    late_start_ms: float = 0.0  # the latest client process's start after the level's
    server: dict = field(default_factory=dict)  # scrape.breakdown
    error_sample: str | None = None
    stall_at: dict = field(default_factory=dict)  # the piece each stalled stream first waited for -> streams
    # audio pieces per stream as the client got them (a socket read, an SSE event, a RunPod job item): a transport
    # that falls behind and sends what piled up at once (RunPod's coalesced items) shows fewer than the engine's chunks
    pieces_p50: float = float("nan")
    # from the last audio to the request's end (the body's close, RunPod's done post with its aggregate of the items)
    end_after_audio_p95_ms: float = float("nan")
    rtf_max: float = float("nan")  # the slowest stream's (request time / audio time): 1 / rtf_max is its x real time


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summarise(parts: list[dict], fmt: str, concurrency: int, arrivals: str, chars: int) -> Level:
    records = [r for p in parts for r in p["records"]]
    ok = [r for r in records if r["error"] is None]
    wall = max(p["end"] for p in parts) - min(p["begin"] for p in parts)
    audio = [r["audio_s"] for r in ok]
    rtf = [r["end"] / r["audio_s"] for r in ok if r["audio_s"] > 0]
    ms = lambda key, q: pct([r[key] * 1000 for r in ok if r[key] is not None], q)  # noqa: E731
    errors = [r["error"] for r in records if r["error"] is not None]
    lags = [x * 1000 for p in parts for x in p["lags"]]
    return Level(
        format=fmt, concurrency=concurrency, arrivals=arrivals, processes=len(parts), requests=len(records),
        errors=len(errors), wall_s=wall, requests_per_s=len(ok) / wall, chars_per_s=len(ok) * chars / wall,
        ttfb_p50_ms=ms("ttfb", 50), ttfb_p95_ms=ms("ttfb", 95), ttfb_p99_ms=ms("ttfb", 99),
        first_audio_p50_ms=ms("first", 50), first_audio_p95_ms=ms("first", 95), first_audio_p99_ms=ms("first", 99),
        rtf_p50=pct(rtf, 50), rtf_p95=pct(rtf, 95), audio_s_per_s=sum(audio) / wall,
        stalls=sum(r["stalls"] for r in ok), stalled_streams=sum(r["stalls"] > 0 for r in ok),
        stall_s=sum(r["stall_s"] for r in ok), stall_p95_ms=pct([r["stall_s"] * 1000 for r in ok], 95),
        client_cpu_pct=[round(100 * p["cpu_s"] / max(p["end"] - p["begin"], 1e-9), 1) for p in parts],
        send_lag_p95_ms=pct(lags, 95) if lags else None,
        late_start_ms=1000 * max(p["late_start_s"] for p in parts), error_sample=errors[0] if errors else None,
        rtf_max=max(rtf, default=float("nan")),
        stall_at=dict(sorted(Counter(r["stall_at"] for r in ok if r.get("stall_at") is not None).items())),
        pieces_p50=pct([r["pieces"] for r in ok], 50),
        end_after_audio_p95_ms=pct([1000 * (r["end"] - r["last"]) for r in ok if r["last"] is not None], 95))
