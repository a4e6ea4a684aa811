"""`python -m ttsengine loadtest URL`: a concurrency sweep against a running server (or RunPod worker).

Per format and level: requests/s, time to response headers (TTFB) and to the first audio bytes, p50/p95/p99,
real-time factor (request time / audio time), delivered audio seconds per second, stalls (the audio running dry
after playback started), characters/s and errors; the load generator's CPU use per client process; and the
server's side of the level from its /metrics, read before and after (queue wait, the engine's first audio, the
first audio bytes sent; with TTS_TRACE_CHUNKS=1 on the server, the per-chunk stages and its CPU per thread).
Closed loop by default (each client sends its next request when the last one ended); `--arrivals poisson:RATE`
sends the level's requests open loop. `--door` picks the way in (tools/load/doors.py): http (OpenAI's speech API,
the default), serve (SageMaker's streaming /invocations against `python -m handlers serve`) or runpod (URL is where
this process hosts a local RunPod job queue for `python -m handlers runpod`; tools/load/runpod_door.py).
`--processes N` spreads the clients over N processes. `--client` picks the HTTP client: raw (default, a minimal
HTTP/1.1 client that costs little CPU per chunk) or httpx. Prints a table and writes loadtest.json and
loadtest.html (plots).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

from . import report as report_page
from .load import runpod_door, scrape
from .load.client import CLIENTS, run_share
from .load.doors import DOORS
from .load.schedule import START_S, poisson_rate, shares
from .load.summary import Level, summarise

TEXT = "The quick brown fox jumps over the lazy dog while the bright sun shines warmly on the quiet green meadow."
FORMATS = ("pcm", "wav", "mp3", "opus", "flac")


def run_level(url: str, concurrency: int, requests: int, body: dict, headers: dict, timeout: float,
              arrivals: str = "closed", pool: ProcessPoolExecutor | None = None, processes: int = 1,
              client: str = "raw", door: str = "http", queue: runpod_door.JobQueue | None = None) -> Level:
    """One level through the door; runpod's goes through `queue`. Only the HTTP server has /metrics to read (serve
    and the RunPod worker keep their series in the process)."""
    rate = poisson_rate(arrivals)
    parts = shares(concurrency, requests, processes if pool is not None else 1, rate)
    metrics = door == "http"
    before = scrape.read(url) if metrics else None
    if queue is not None:
        done = [runpod_door.run_share(queue, parts[0], body, timeout)]
    elif pool is None:
        done = [run_share(parts[0], url, body, headers, timeout, time.monotonic(), client, door)]
    else:
        start_at = time.monotonic() + START_S
        same = (url, body, headers, timeout, start_at, client, door)
        done = list(pool.map(run_share, parts, *([x] * len(parts) for x in same)))
    level = summarise(done, body.get("response_format", "pcm"), concurrency, arrivals, len(body["input"]))
    level.server = scrape.breakdown(before, scrape.read(url)) if metrics else {}
    return level


def render_html(report: dict) -> str:
    fig, axes = report_page.three_axes()
    for fmt in dict.fromkeys(lv["format"] for lv in report["levels"]):
        levels = [lv for lv in report["levels"] if lv["format"] == fmt]
        c = [lv["concurrency"] for lv in levels]
        axes[0].plot(c, [lv["audio_s_per_s"] for lv in levels], "o-", label=f"{fmt} audio s per s")
        axes[1].plot(c, [lv["first_audio_p50_ms"] for lv in levels], "o-", label=f"{fmt} first audio p50")
        axes[1].plot(c, [lv["first_audio_p95_ms"] for lv in levels], "o--", label=f"{fmt} first audio p95")
        axes[2].plot(c, [lv["rtf_p95"] for lv in levels], "o-", label=f"{fmt} RTF p95")
    axes[0].set(title="throughput", xlabel="concurrency")
    axes[1].set(title="latency (ms)", xlabel="concurrency")
    axes[2].axhline(1.0, color="gray", ls="--", label="real time")
    axes[2].set(title="real-time factor (lower is faster)", xlabel="concurrency")
    for ax in axes:
        ax.legend()
    return report_page.page("loadtest", report, fig)


COLUMNS = ("format", "concurrency", "requests", "errors", "requests_per_s", "ttfb_p50_ms", "first_audio_p50_ms",
           "first_audio_p95_ms", "first_audio_p99_ms", "rtf_p50", "rtf_p95", "audio_s_per_s", "stalls",
           "stalled_streams", "stall_s", "client_cpu_pct")
SERVER = ("first_received", "first_planned", "first_admitted", "queue_wait", "first_started", "engine_first_audio",
          "first_engine_audio", "first_emitted", "first_byte_sent", "loop_lag", "chunk_wake", "chunk_encode",
          "chunk_send", "chunk_total")


def print_table(levels: list[dict]) -> None:
    print(" | ".join(COLUMNS))
    for lv in levels:
        print(" | ".join(report_page.fmt(lv[k]) if k != "client_cpu_pct" else "/".join(map(str, lv[k]))
                         for k in COLUMNS))
    for lv in levels:
        if lv.get("stall_at"):
            at = ", ".join(f"{k}: {v}" for k, v in list(lv["stall_at"].items())[:6])
            print(f"  {lv['format']} {lv['concurrency']}: first stall at piece (index: streams) {at}")
    if any(lv["server"] for lv in levels):
        print("server (mean / p50 / p95 ms per level; engine host s = loop less step waits):")
        for lv in levels:
            sv = lv["server"]
            parts = [f"{k} {sv[k]['mean_ms']:.0f}/{sv[k]['p50_ms']:.0f}/{sv[k]['p95_ms']:.0f}"
                     for k in SERVER if k in sv and sv[k]["count"]]
            parts.append(f"engine loop {sv.get('engine_loop_s', 0):.2f} s, host {sv.get('engine_host_s', 0):.2f} s")
            if "thread_cpu_s" in sv:
                parts.append("cpu s " + ", ".join(f"{k} {v:.2f}" for k, v in sv["thread_cpu_s"].items()))
            print(f"  {lv['format']} {lv['concurrency']}: " + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine loadtest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--concurrency", default="1,4,16,64", help="closed loop: clients per level; open loop: the "
                    "level's size (its requests default to 2 x this)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: 2 x concurrency)")
    ap.add_argument("--arrivals", default="closed", help="closed (default) or poisson:RATE (open loop, RATE "
                    "requests per second)")
    ap.add_argument("--processes", type=int, default=1, help="client processes sharing each level (their CPU "
                    "use is reported: near 100%% the generator, not the server, may set the pace)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--format", default="pcm", help=f"one or several of {','.join(FORMATS)}, comma-separated: "
                    "each runs the whole sweep")
    ap.add_argument("--voice")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--client", choices=CLIENTS, default="raw", help="the HTTP client: raw (default: a minimal "
                    "HTTP/1.1 client, little CPU per chunk) or httpx")
    ap.add_argument("--door", choices=DOORS, default="http", help="the way in: http (default), serve (SageMaker's "
                    "/invocations, streamed) or runpod (URL: where to host a job queue for `python -m handlers "
                    "runpod`; waits --timeout s for the worker's first poll; one client process)")
    ap.add_argument("--out", type=Path, default=Path("loadtest-out"))
    args = ap.parse_args(argv)
    formats = args.format.split(",")
    if bad := [f for f in formats if f not in FORMATS]:
        ap.error(f"--format: unknown {','.join(bad)} (choose from {','.join(FORMATS)})")
    try:
        poisson_rate(args.arrivals)
    except ValueError as e:
        ap.error(str(e))
    if args.processes < 1:
        ap.error("--processes must be at least 1")
    if args.door == "runpod":
        if args.processes > 1:
            ap.error("--door runpod takes one client process (the job queue lives in it); leave --processes at 1")
        try:
            runpod_door.listen_address(args.url)
        except ValueError as e:
            ap.error(str(e))
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/")
    levels = []
    pool = (ProcessPoolExecutor(args.processes, mp_context=get_context("spawn")) if args.processes > 1 else None)
    queue = None
    if args.door == "runpod":
        print(f"waiting up to {args.timeout:g} s for a RunPod worker to poll the job queue at {url}", flush=True)
        try:
            queue = runpod_door.start_queue(url, args.timeout)
        except (OSError, TimeoutError) as e:
            print(f"loadtest: {e}", file=sys.stderr)
            return 2
    try:
        for fmt in formats:
            body = {"input": args.text, "response_format": fmt, "seed": 1}
            if args.voice:
                body["voice"] = args.voice
            if args.max_new_tokens:
                body["max_new_tokens"] = args.max_new_tokens
            for c in (int(x) for x in args.concurrency.split(",")):
                lv = run_level(url, c, args.requests or 2 * c, body, headers, args.timeout, args.arrivals, pool,
                               args.processes, args.client, args.door, queue)
                levels.append(lv)
                print(f"  {fmt} level {c}: {lv.requests} requests, {lv.errors} errors, {lv.requests_per_s:.2f} "
                      f"req/s, client CPU {'/'.join(map(str, lv.client_cpu_pct))} %", flush=True)
    finally:
        if pool is not None:
            pool.shutdown()
        if queue is not None:
            queue.stop()
    report = {"url": url, "door": args.door, "text_chars": len(args.text), "formats": formats,
              "arrivals": args.arrivals, "processes": args.processes, "client": args.client,
              "levels": [asdict(lv) for lv in levels]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loadtest.json").write_text(json.dumps(report, indent=2))
    (args.out / "loadtest.html").write_text(render_html(report))
    print_table(report["levels"])
    if any(lv.errors for lv in levels):
        print("errors, e.g.:", next(lv.error_sample for lv in levels if lv.errors))
    print(f"wrote {args.out / 'loadtest.json'} and {args.out / 'loadtest.html'}")
    return 1 if all(lv.errors == lv.requests for lv in levels) else 0


if __name__ == "__main__":
    raise SystemExit(main())
