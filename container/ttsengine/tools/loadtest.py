"""`python -m ttsengine loadtest URL`: a concurrency sweep against a running server's OpenAI endpoint.

Per level: requests/s, time to response headers (TTFB) and to the first audio bytes, p50/p95/p99,
real-time factor (request time / audio time), characters/s and errors. Prints a table and writes
loadtest.json and loadtest.html (plots). Streams PCM by default, so audio time is exact.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import report as report_page

TEXT = "The quick brown fox jumps over the lazy dog while the bright sun shines warmly on the quiet green meadow."


@dataclass
class Level:
    concurrency: int
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
    error_sample: str | None = None


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24000
    import soundfile as sf

    audio, rate = sf.read(io.BytesIO(data))
    return len(audio) / rate


async def _one(client, url: str, body: dict, headers: dict) -> dict:
    t0 = time.perf_counter()
    out = {"ttfb": None, "first": None, "end": None, "bytes": b"", "error": None}
    try:
        async with client.stream("POST", url + "/v1/audio/speech", json=body, headers=headers) as r:
            out["ttfb"] = time.perf_counter() - t0
            if r.status_code != 200:
                out["error"] = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return out
            parts = []
            async for chunk in r.aiter_raw():
                if out["first"] is None and chunk:
                    out["first"] = time.perf_counter() - t0
                parts.append(chunk)
            out["bytes"] = b"".join(parts)
        out["end"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - counted as an error of this request
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def run_level(url: str, concurrency: int, requests: int, body: dict, headers: dict, timeout: float) -> Level:
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[dict] = []

    async def worker(client):
        while not queue.empty():
            i = queue.get_nowait()
            results.append(await _one(client, url, {**body, "seed": body.get("seed", 0) + i}, headers))

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["error"] is None]
    fmt = body.get("response_format", "pcm")
    audio = [_seconds(r["bytes"], fmt) for r in ok]
    rtf = [r["end"] / a for r, a in zip(ok, audio) if a > 0]
    ms = lambda key, p: _pct([r[key] * 1000 for r in ok if r[key] is not None], p)  # noqa: E731
    errors = [r["error"] for r in results if r["error"] is not None]
    return Level(concurrency=concurrency, requests=len(results), errors=len(errors), wall_s=wall,
                 requests_per_s=len(ok) / wall, chars_per_s=len(ok) * len(body["input"]) / wall,
                 ttfb_p50_ms=ms("ttfb", 50), ttfb_p95_ms=ms("ttfb", 95), ttfb_p99_ms=ms("ttfb", 99),
                 first_audio_p50_ms=ms("first", 50), first_audio_p95_ms=ms("first", 95),
                 first_audio_p99_ms=ms("first", 99), rtf_p50=_pct(rtf, 50), rtf_p95=_pct(rtf, 95),
                 audio_s_per_s=sum(audio) / wall, error_sample=errors[0] if errors else None)


def render_html(report: dict) -> str:
    levels = report["levels"]
    c = [lv["concurrency"] for lv in levels]
    fig, axes = report_page.three_axes()
    axes[0].plot(c, [lv["requests_per_s"] for lv in levels], "o-", label="requests/s")
    axes[0].plot(c, [lv["audio_s_per_s"] for lv in levels], "o-", label="audio s per s")
    axes[0].set(title="throughput", xlabel="concurrent clients")
    axes[0].legend()
    for key, label in (("first_audio_p50_ms", "first audio p50"), ("first_audio_p95_ms", "first audio p95"),
                       ("ttfb_p50_ms", "TTFB p50")):
        axes[1].plot(c, [lv[key] for lv in levels], "o-", label=label)
    axes[1].set(title="latency (ms)", xlabel="concurrent clients")
    axes[1].legend()
    axes[2].plot(c, [lv["rtf_p50"] for lv in levels], "o-", label="RTF p50")
    axes[2].plot(c, [lv["rtf_p95"] for lv in levels], "o-", label="RTF p95")
    axes[2].axhline(1.0, color="gray", ls="--", label="real time")
    axes[2].set(title="real-time factor (lower is faster)", xlabel="concurrent clients")
    axes[2].legend()
    return report_page.page("loadtest", report, fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine loadtest", description=__doc__.splitlines()[0])
    ap.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: 2 x concurrency)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--format", default="pcm", choices=["pcm", "wav", "flac"], help="exact-length formats")
    ap.add_argument("--voice")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("loadtest-out"))
    args = ap.parse_args(argv)
    body = {"input": args.text, "response_format": args.format, "seed": 1}
    if args.voice:
        body["voice"] = args.voice
    if args.max_new_tokens:
        body["max_new_tokens"] = args.max_new_tokens
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/")
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        levels.append(asyncio.run(run_level(url, c, args.requests or 2 * c, body, headers, args.timeout)))
        lv = levels[-1]
        print(f"  level {c}: {lv.requests} requests, {lv.errors} errors, {lv.requests_per_s:.2f} req/s", flush=True)
    report = {"url": url, "text_chars": len(args.text), "format": args.format,
              "levels": [asdict(lv) for lv in levels]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loadtest.json").write_text(json.dumps(report, indent=2))
    (args.out / "loadtest.html").write_text(render_html(report))
    cols = ("concurrency", "requests", "errors", "requests_per_s", "ttfb_p50_ms", "first_audio_p50_ms",
            "first_audio_p95_ms", "first_audio_p99_ms", "rtf_p50", "rtf_p95", "chars_per_s", "audio_s_per_s")
    print(" | ".join(cols))
    for lv in report["levels"]:
        print(" | ".join(report_page.fmt(lv[k]) for k in cols))
    if any(lv.errors for lv in levels):
        print("errors, e.g.:", next(lv.error_sample for lv in levels if lv.errors))
    print(f"wrote {args.out / 'loadtest.json'} and {args.out / 'loadtest.html'}")
    return 1 if all(lv.errors == lv.requests for lv in levels) else 0


if __name__ == "__main__":
    raise SystemExit(main())
