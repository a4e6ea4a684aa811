"""`python -m ttsengine soak URL`: many clients against a running server for a while, the way production mixes
them: streamed speech in every format, a stored voice, clients that hang up mid-stream, SSE, and bad requests.

Every request ends in one kind: ok (the whole body arrived, properly ended), cut (this client hung up on
purpose), rejected (a bad request answered with a 4xx JSON error, as it should be), busy (503 with Retry-After),
unexpected (anything else: a 5xx, a good request refused, a bad one accepted, a broken or empty body) or hang
(no byte for --stall seconds). Per minute: the counts, audio seconds per second, first audio p50/p95 (of the
streamed formats: FLAC is sent whole, when the audio ends), the server's RSS (--server-pid) and the engines'
GPU memory (/metrics). `--processes N` deals the clients over N client processes (their CPU use is printed).
Writes soak.json; exits 1 when any request was unexpected or hung.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

from . import report as report_page
from .load.schedule import START_S
from .load.summary import pct

TEXTS = ("Hello there, this is a short one.",
         "The quick brown fox jumps over the lazy dog while the bright sun shines on the meadow.",
         "Numbers like 42 and 1,234 and dates like March 3rd should be read out naturally.",
         "A longer sentence gives the decoder more work: it keeps its slot for several seconds, and the codec "
         "streams its audio in chunks while other requests arrive and leave around it.")
FORMATS = ("pcm", "wav", "mp3", "opus", "flac")
KINDS = ("ok", "cut", "rejected", "busy", "unexpected", "hang")
PCM_RATE = 24000


@dataclass
class Outcome:
    t: float  # seconds since the start, when the request ended
    kind: str
    first_ms: float | None = None
    audio_s: float = 0.0
    detail: str = ""
    streamed: bool = True  # the format sends audio as it is made (FLAC is written whole at the end)


@dataclass
class Minute:
    minute: int
    counts: dict
    audio_s_per_s: float
    first_audio_p50_ms: float
    first_audio_p95_ms: float
    rss_mb: float | None
    gpu_mb: float | None
    active_streams: float | None


@dataclass
class Plan:
    """What one request does, drawn by a client."""
    action: str  # stream | cut | sse | bad
    body: dict = field(default_factory=dict)
    raw: bytes | None = None  # a bad request's raw body
    content_type: str = "application/json"
    cut_after: int = 1  # chunks read before hanging up


BAD = (  # (raw body, content type): each must be answered with a 4xx JSON error
    (b'{"input": "unterminated', "application/json"),
    (b'{"input": ""}', "application/json"),
    (b'{"input": "x", "voice": "no-such-voice-here"}', "application/json"),
    (b'{"input": "x", "speed": 40}', "application/json"),
    (b'{"input": "x", "response_format": "xyz"}', "application/json"),
    (b'{"input": "x"}', "text/plain"),
    (b'[' * 5000, "application/json"),
    (b'{"input": "x", "max_new_tokens": -5}', "application/json"),
)


def draw(rng: random.Random, voice: str | None, max_frames: int, formats: tuple[str, ...] = FORMATS) -> Plan:
    body = {"input": rng.choice(TEXTS), "response_format": rng.choice(formats), "seed": rng.randrange(1 << 30),
            "max_new_tokens": rng.randint(max(8, max_frames // 4), max_frames)}
    if voice and rng.random() < 0.5:
        body["voice"] = voice
    r = rng.random()
    if r < 0.60:
        return Plan("stream", body)
    if r < 0.75:
        return Plan("cut", body, cut_after=rng.randint(1, 4))
    if r < 0.82:
        return Plan("sse", {**body, "stream_format": "sse", "response_format": "pcm"})
    raw, ctype = rng.choice(BAD)
    return Plan("bad", raw=raw, content_type=ctype)


async def run_one(client, url: str, plan: Plan, headers: dict, t_start: float) -> Outcome:
    import httpx

    t0 = time.monotonic()
    first = None

    def done(kind: str, audio_s: float = 0.0, detail: str = "") -> Outcome:
        ms = None if first is None else (first - t0) * 1000
        return Outcome(time.monotonic() - t_start, kind, ms, audio_s, detail[:300],
                       plan.body.get("response_format") != "flac")

    content = plan.raw if plan.action == "bad" else json.dumps(plan.body).encode()
    try:
        async with client.stream("POST", url + "/v1/audio/speech", content=content,
                                 headers={**headers, "content-type": plan.content_type}) as r:
            if plan.action == "bad":
                body = await r.aread()
                ok = 400 <= r.status_code < 500 and "error" in json.loads(body or b"{}")
                return done("rejected" if ok else "unexpected", detail=f"bad request -> {r.status_code} {body[:120]}")
            if r.status_code == 503 and r.headers.get("retry-after"):
                await r.aread()
                return done("busy")
            if r.status_code != 200:
                return done("unexpected", detail=f"{r.status_code}: {(await r.aread())[:200]}")
            parts, n = [], 0
            async for chunk in r.aiter_raw():
                if not chunk:
                    continue
                first = first or time.monotonic()
                parts.append(chunk)
                n += 1
                if plan.action == "cut" and n >= plan.cut_after:
                    return done("cut")  # leaving the block closes the connection: the server must free the slot
        data = b"".join(parts)
        if plan.action == "sse":
            events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
            if not events or events[-1].get("type") != "speech.audio.done":
                return done("unexpected", detail=f"SSE ended with {events[-1] if events else 'nothing'}")
            return done("ok", events[-1]["usage"]["output_frames"] * 2048 / 44100)
        if not data:
            return done("unexpected", detail="200 with an empty body")
        return done("ok", audio_seconds(data, plan.body["response_format"]))
    except httpx.ReadTimeout:
        return done("hang", detail="no byte for the stall limit")
    except Exception as e:  # noqa: BLE001 - a broken transfer, a refused connection: what the soak looks for
        return done("unexpected", detail=f"{type(e).__name__}: {e}")


def audio_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / PCM_RATE
    if fmt in ("wav", "flac"):
        import soundfile as sf

        info = sf.info(io.BytesIO(data))
        return info.frames / info.samplerate
    return 0.0  # compressed: counted as ok by its complete transfer, not timed


def read_rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def scrape(client, url: str, headers: dict) -> tuple[float | None, float | None]:
    """(GPU memory MB summed over engines, active streams) from /metrics."""
    try:
        text = (await client.get(url + "/metrics", headers=headers, timeout=10)).text
    except Exception:  # noqa: BLE001 - a missed sample is a gap in the table, not a failure
        return None, None
    gpu = active = None
    for line in text.splitlines():
        if line.startswith("tts_engine_gpu_memory_allocated_bytes{"):
            gpu = (gpu or 0) + float(line.split()[-1]) / 2**20
        elif line.startswith("tts_active_streams "):
            active = float(line.split()[-1])
    return gpu, active


async def make_voice(client, url: str, headers: dict, seconds: float) -> str:
    """A stored voice from `seconds` of random-ish audio (a chirp plus noise), for the voice's prefill path."""
    import numpy as np
    import soundfile as sf

    rate = 44100
    t = np.arange(int(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    audio += 0.02 * np.random.default_rng(0).standard_normal(len(t))
    buf = io.BytesIO()
    sf.write(buf, audio.astype("float32"), rate, format="WAV")
    voice = "soak-voice"
    await client.request("DELETE", url + "/v1/references/delete", json={"reference_id": voice}, headers=headers)
    r = await client.post(url + "/v1/references/add", headers=headers, data={"id": voice, "text": TEXTS[1]},
                          files={"audio": ("voice.wav", buf.getvalue(), "audio/wav")})
    if r.status_code not in (200, 201):
        raise SystemExit(f"soak: could not store the voice: {r.status_code} {r.text[:200]}")
    return voice


def http_client(args, connections: int):
    import httpx

    limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
    return httpx.AsyncClient(timeout=httpx.Timeout(args.stall, connect=30), limits=limits)


async def clients(args, url: str, indices: list[int], voice: str | None, headers: dict, t_start: float,
                  end: float) -> list[Outcome]:
    """Clients `indices` (each its own seeded draws) until `end` (time.monotonic()) -> their outcomes."""
    outcomes: list[Outcome] = []
    async with http_client(args, len(indices)) as client:
        await asyncio.sleep(max(0.0, t_start - time.monotonic()))

        async def client_loop(i: int) -> None:
            rng = random.Random(args.seed * 100003 + i)
            await asyncio.sleep(rng.random() * min(5.0, args.minutes * 6))  # arrivals spread, not one burst
            while time.monotonic() < end:
                plan = draw(rng, voice, args.max_frames, args.formats)
                outcomes.append(await run_one(client, url, plan, headers, t_start))

        await asyncio.gather(*(client_loop(i) for i in indices))
    return outcomes


def client_process(args, url: str, indices: list[int], voice: str | None, headers: dict, t_start: float,
                   end: float) -> tuple[list[Outcome], float]:
    """One client process's share -> (its outcomes, its CPU seconds)."""
    cpu0 = time.process_time()
    outcomes = asyncio.run(clients(args, url, indices, voice, headers, t_start, end))
    return outcomes, time.process_time() - cpu0


async def soak(args) -> dict:
    """The clients, in this process's loop or dealt round-robin over --processes spawned processes (the load
    generator's CPU must not be what limits a 256-client soak); the server sampled from here meanwhile."""
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    samples: list[tuple[float, float | None, float | None, float | None]] = []  # (t, rss, gpu, active)
    n = min(args.processes, args.clients)
    shares = [list(range(k, args.clients, n)) for k in range(n)]
    async with http_client(args, 4) as client:
        voice = args.voice or (await make_voice(client, url, headers, args.voice_seconds)
                               if args.voice_seconds > 0 else None)
        t_start = time.monotonic() + (START_S if n > 1 else 0.0)
        end = t_start + args.minutes * 60
        async def in_this_loop() -> tuple[list[Outcome], float]:  # client_process's result, without a process
            cpu0 = time.process_time()
            outcomes = await clients(args, url, shares[0], voice, headers, t_start, end)
            return outcomes, time.process_time() - cpu0

        async def sampler() -> None:
            await asyncio.sleep(max(0.0, t_start - time.monotonic()))
            while True:
                gpu, active = await scrape(client, url, headers)
                samples.append((time.monotonic() - t_start, read_rss_mb(args.server_pid), gpu, active))
                if time.monotonic() >= end:
                    return
                await asyncio.sleep(min(args.interval, max(0.1, end - time.monotonic())))

        if n == 1:
            parts = [in_this_loop()]
        else:
            loop = asyncio.get_running_loop()
            pool = ProcessPoolExecutor(n, mp_context=get_context("spawn"))
            parts = [loop.run_in_executor(pool, client_process, args, url, share, voice, headers, t_start, end)
                     for share in shares]
        try:
            done = await asyncio.gather(sampler(), *parts)
        finally:
            if n > 1:
                pool.shutdown(cancel_futures=True)
        wall = time.monotonic() - t_start
    outcomes = [o for part, _ in done[1:] for o in part]
    cpu = [c for _, c in done[1:]]
    outcomes.sort(key=lambda o: o.t)
    minutes = summarize(outcomes, samples, args.interval, wall)
    counts = {k: sum(o.kind == k for o in outcomes) for k in KINDS}
    examples = {k: next(o.detail for o in outcomes if o.kind == k) for k in ("unexpected", "hang") if counts[k]}
    return {"url": url, "clients": args.clients, "processes": n, "minutes": args.minutes, "wall_s": wall,
            "voice": voice, "counts": counts, "examples": examples,
            "client_cpu_pct": [round(100 * c / wall) for c in cpu], "per_interval": [asdict(m) for m in minutes],
            "whole": asdict(summarize(outcomes, samples, wall, wall)[0])}  # the soak as one interval


def summarize(outcomes: list[Outcome], samples: list, interval: float, wall: float) -> list[Minute]:
    rows = []
    n = max(1, int(-(-wall // interval)))
    for m in range(n):
        lo, hi = m * interval, (m + 1) * interval
        these = [o for o in outcomes if lo <= o.t < hi]
        firsts = [o.first_ms for o in these if o.first_ms is not None and o.kind == "ok" and o.streamed]
        last = [s for s in samples if s[0] < hi]
        rss, gpu, active = (last[-1][1:] if last else (None, None, None))
        span = min(hi, wall) - lo
        rows.append(Minute(m, {k: sum(o.kind == k for o in these) for k in KINDS},
                           sum(o.audio_s for o in these) / span if span > 0 else 0.0,
                           pct(firsts, 50), pct(firsts, 95), rss, gpu, active))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=256, help="concurrent clients (default 256)")
    ap.add_argument("--processes", type=int, default=1, help="client processes sharing the clients (default 1; "
                    "each one's CPU use is printed: a busy load generator delays what it measures)")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=60.0, help="seconds per table row (default 60)")
    ap.add_argument("--max-frames", type=int, default=200, help="longest request in frames (~21.5 per second)")
    ap.add_argument("--voice", help="a stored voice to use (default: store a random one)")
    ap.add_argument("--voice-seconds", type=float, default=10.0, help="length of the stored random voice (0: none)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="response formats drawn from (default: all)")
    ap.add_argument("--server-pid", type=int, help="the server's process id, for its RSS (same machine)")
    ap.add_argument("--stall", type=float, default=120.0, help="seconds without a byte that count as a hang")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--api-key")
    ap.add_argument("--out", type=Path, default=Path("soak-out"))
    args = ap.parse_args(argv)
    if args.clients < 1 or args.processes < 1 or args.minutes <= 0 or args.interval <= 0:
        raise SystemExit("soak: --clients, --processes, --minutes and --interval must be positive")
    args.formats = tuple(f.strip() for f in args.formats.split(","))
    if not set(args.formats) <= set(FORMATS):
        raise SystemExit(f"soak: --formats takes {', '.join(FORMATS)}")
    report = asyncio.run(soak(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2))
    cols = ("minute", *KINDS, "audio_s_per_s", "first_audio_p50_ms", "first_audio_p95_ms", "rss_mb", "gpu_mb",
            "active_streams")
    print(" | ".join(cols))
    for row in [*report["per_interval"], {**report["whole"], "minute": "all"}]:
        print(" | ".join(report_page.fmt(row["counts"][k] if k in KINDS else row[k]) for k in cols))
    print("total:", ", ".join(f"{k} {v}" for k, v in report["counts"].items()))
    print(f"load generator: {report['processes']} process(es), CPU % each: {report['client_cpu_pct']}")
    for kind, detail in report["examples"].items():
        print(f"{kind}, e.g.: {detail}")
    print(f"report: {args.out / 'soak.json'}")
    return 1 if report["counts"]["unexpected"] or report["counts"]["hang"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
