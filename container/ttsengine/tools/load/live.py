"""`python -m ttsengine livetest URL`: voice-agent sessions over Fish's live WebSocket (`/v1/tts/live`), each fed
by a simulated LLM: the text goes out in word-sized tokens at --tokens-per-s, then `stop`, and the audio comes back
as the server makes it. Per session: text to first audio (from the token that completed the first sentence, the
moment the server could start it, to the first audio message), x real time after the first audio (audio seconds
over the time from the first audio to the last), stalls as a listener hears them; with --barge-in S each session's
turn is cancelled S seconds after its first audio and the time from `cancel` to the last audio and to `finish` is
reported. The server's own side (tts_live_segment_first_audio_seconds, every segment's; tts_time_to_first_audio_seconds,
the engine's submit to first audio; tts_live_barge_in_seconds, cancel to the engine's slot freed) is read from
/metrics before and after. --processes N spreads the sessions over N client processes (each one's CPU use is
reported). Prints a table, writes livetest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import msgpack

from . import scrape
from .playback import stalls
from .schedule import START_S
from .summary import pct

TEXT = ("Thanks for calling, I can help you with that right away. Your order left our warehouse this morning and "
        "should arrive on Thursday. Would you like me to send the tracking link to your phone? I can also change "
        "the delivery address if you are not at home. Is there anything else I can do for you today?")
_TOKEN = re.compile(r"\s*[\w'’-]+|\s*[^\w\s]")  # a word with its leading space, or one punctuation mark
_SENTENCE_DONE = re.compile(r"[.!?;]\s")  # the server cuts a segment at a sentence end followed by white space


def tokens(text: str) -> list[str]:
    """text -> LLM-like pieces (" quick", ".", " Next"): joined, they are the text again (less stray spaces)."""
    return _TOKEN.findall(text)


def _pack(**event) -> bytes:
    return msgpack.packb(event, use_bin_type=True)


async def _feed(ws, pieces: list[str], rate: float, marks: dict) -> None:
    """The simulated LLM: one piece per 1/rate s; marks['complete'] = when the first sentence became complete."""
    sent = ""
    for piece in pieces:
        if marks.get("cancelled"):
            return
        await ws.send(_pack(event="text", text=piece))
        sent += piece
        if "complete" not in marks and _SENTENCE_DONE.search(sent):
            marks["complete"] = time.perf_counter()
        await asyncio.sleep(1 / rate)
    marks.setdefault("complete", time.perf_counter())  # no sentence end: `stop` completes the text
    if not marks.get("cancelled"):
        await ws.send(_pack(event="stop"))


async def _barge_in(ws, after: float, marks: dict) -> None:
    await asyncio.sleep(after)
    marks["cancelled"] = time.perf_counter()
    await ws.send(_pack(event="cancel"))


async def turn(ws, request: dict, pieces: list[str], rate: float, sample_rate: int, barge_in: float | None,
               timeout: float) -> dict:
    """One start .. finish on an open socket -> its record."""
    started, started_unix = time.perf_counter(), time.time()
    await ws.send(_pack(event="start", request=request))
    marks: dict = {}
    feeder = asyncio.create_task(_feed(ws, pieces, rate, marks))
    arrivals: list[tuple[float, float]] = []  # (arrival, audio seconds)
    canceller = None
    try:
        while True:
            event = msgpack.unpackb(await asyncio.wait_for(ws.recv(), timeout), raw=False)
            now = time.perf_counter()
            if event.get("event") == "audio":
                arrivals.append((now, len(event["audio"]) / 2 / sample_rate))
                if barge_in is not None and canceller is None:
                    canceller = asyncio.create_task(_barge_in(ws, barge_in, marks))
            elif event.get("event") == "finish":
                break
    finally:
        for task in (feeder, canceller):
            if task is not None and not task.done():
                task.cancel()
    reason, finished = event.get("reason"), now
    record = {"error": event.get("message") if reason == "error" else None, "reason": reason,
              "audio_s": sum(s for _, s in arrivals), "first_audio_ms": None, "x_real_time": None,
              "stalls": 0, "stall_s": 0.0, "cancel_to_last_audio_ms": None, "cancel_to_finish_ms": None,
              "started_unix": started_unix,  # when `start` went (time.time(): the same clock in every process)
              "complete_ms": 1000 * (marks["complete"] - started) if "complete" in marks else None}
    if arrivals and "complete" in marks:
        record["first_audio_ms"] = 1000 * (arrivals[0][0] - marks["complete"])
        span = arrivals[-1][0] - arrivals[0][0]
        played = record["audio_s"] - arrivals[-1][1]  # what had to play out before the last piece came
        record["x_real_time"] = played / span if span > 0 else None
        record["stalls"], record["stall_s"] = stalls(arrivals)
    if "cancelled" in marks:
        last = max((t for t, _ in arrivals), default=marks["cancelled"])
        record["cancel_to_last_audio_ms"] = 1000 * max(0.0, last - marks["cancelled"])
        record["cancel_to_finish_ms"] = 1000 * (finished - marks["cancelled"])
    return record


async def session(url: str, headers: dict, request: dict, pieces: list[str], args, delay: float) -> list[dict]:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    ws_url = url.replace("http://", "ws://").replace("https://", "wss://") + "/v1/tts/live"
    try:
        async with connect(ws_url, additional_headers=headers, max_size=None, open_timeout=args.timeout) as ws:
            connect_ms = 1000 * (time.perf_counter() - t0)
            return [await turn(ws, request, pieces, args.tokens_per_s, args.sample_rate, args.barge_in,
                               args.timeout) | {"connect_ms": connect_ms} for _ in range(args.turns)]
    except Exception as e:  # noqa: BLE001 - a refused or broken session is a figure of the run, not a crash
        return [{"error": f"{type(e).__name__}: {e}"[:300]}]


def summarise(records: list[dict], wall: float) -> dict:
    ok = [r for r in records if r["error"] is None]
    speeds = [r["x_real_time"] for r in ok if r.get("x_real_time")]
    firsts = [r["first_audio_ms"] for r in ok if r.get("first_audio_ms") is not None]
    out = {"turns": len(records), "errors": len(records) - len(ok),
           "error_sample": next((r["error"] for r in records if r["error"]), None),
           "first_audio_p50_ms": pct(firsts, 50), "first_audio_p95_ms": pct(firsts, 95),
           "first_audio_max_ms": max(firsts, default=float("nan")),
           "x_real_time_min": min(speeds, default=float("nan")), "x_real_time_p50": pct(speeds, 50),
           "streams_below_1_2x": sum(s < 1.2 for s in speeds), "stalled_turns": sum(r["stalls"] > 0 for r in ok),
           "audio_s_per_s": sum(r["audio_s"] for r in ok) / wall, "wall_s": wall}
    cancels = [r for r in ok if r.get("cancel_to_finish_ms") is not None]
    if cancels:
        out["cancel_to_last_audio_p95_ms"] = pct([r["cancel_to_last_audio_ms"] for r in cancels], 95)
        out["cancel_to_finish_p95_ms"] = pct([r["cancel_to_finish_ms"] for r in cancels], 95)
    return out


async def _sessions(url: str, headers: dict, request: dict, pieces: list[str], args, delays: list[float]):
    done = await asyncio.gather(*(session(url, headers, request, pieces, args, d) for d in delays))
    return [r for rs in done for r in rs]


def run_share(url: str, headers: dict, request: dict, pieces: list[str], args, delays: list[float],
              start_at: float) -> dict:
    """One client process's sessions (each opening `delay` s after start_at, time.time()) -> their records, the
    share's wall seconds and its CPU use: one process near 100% sets the pace itself, not the server."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, t0 = time.process_time(), time.perf_counter()
    records = asyncio.run(_sessions(url, headers, request, pieces, args, delays))
    wall = time.perf_counter() - t0
    return {"records": records, "wall": wall, "cpu_pct": round(100 * (time.process_time() - cpu0) / wall, 1)}


def run(url: str, headers: dict, request: dict, pieces: list[str], args) -> list[dict]:
    """Every session, dealt round-robin over --processes client processes started together -> their shares."""
    rng = random.Random(1)
    delays = [rng.uniform(0, args.ramp) for _ in range(args.sessions)]
    n = min(args.processes, args.sessions)
    parts = [delays[i::n] for i in range(n)]
    if n == 1:
        return [run_share(url, headers, request, pieces, args, parts[0], time.time())]
    start_at = time.time() + START_S
    with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
        return list(pool.map(run_share, *([x] * n for x in (url, headers, request, pieces, args)), parts,
                             [start_at] * n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine livetest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--sessions", type=int, default=16, help="live sessions at once (default 16)")
    ap.add_argument("--turns", type=int, default=1, help="start .. finish turns per session, one after another")
    ap.add_argument("--tokens-per-s", type=float, default=30.0, help="the simulated LLM's pace (default 30)")
    ap.add_argument("--ramp", type=float, default=1.0, help="sessions open at random times within this many s")
    ap.add_argument("--barge-in", type=float, help="cancel each turn this many s after its first audio")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--voice", help="reference_id of a stored voice")
    ap.add_argument("--max-new-tokens", type=int, help="frames per segment at most")
    ap.add_argument("--sample-rate", type=int, default=24000, help="pcm's rate asked for (default 24000)")
    ap.add_argument("--processes", type=int, default=1, help="client processes sharing the sessions (their CPU use "
                    "is reported: near 100%% the generator, not the server, may set the pace)")
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=120.0, help="s to wait for any one message")
    ap.add_argument("--out", type=Path, default=Path("livetest-out"))
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.turns < 1 or args.processes < 1 or args.tokens_per_s <= 0 or args.ramp < 0:
        ap.error("--sessions, --turns and --processes must be at least 1, --tokens-per-s above 0, --ramp at least 0")
    if not (pieces := tokens(args.text)):
        ap.error("--text has no words")
    try:
        from websockets.asyncio.client import connect  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"ttsengine livetest: needs websockets >= 13 ({e})") from None
    request = {"text": "", "format": "pcm", "sample_rate": args.sample_rate, "seed": 1, "latency": "balanced"}
    if args.voice:
        request["reference_id"] = args.voice
    if args.max_new_tokens is not None:
        request["max_new_tokens"] = args.max_new_tokens
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/")
    before = scrape.read(url)
    shares = run(url, headers, request, pieces, args)
    records = [r for share in shares for r in share["records"]]
    summary = summarise(records, max(share["wall"] for share in shares))
    summary["client_cpu_pct"] = [share["cpu_pct"] for share in shares]
    summary["server"] = scrape.breakdown(before, scrape.read(url))
    report = {"url": url, "sessions": args.sessions, "processes": len(shares), "turns": args.turns,
              "tokens_per_s": args.tokens_per_s,
              "tokens": len(pieces), "barge_in_s": args.barge_in, "summary": summary, "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "livetest.json").write_text(json.dumps(report, indent=2))
    for key, value in summary.items():
        if key != "server":
            print(f"{key}: {round(value, 3) if isinstance(value, float) else value}")
    for key in ("live_first_audio", "live_first_segment", "live_submit_thread", "live_submit_taken",
                "engine_first_audio", "live_barge_in", "loop_lag"):
        if (h := summary["server"].get(key)) and h["count"]:
            print(f"server {key}: n {h['count']:.0f}, mean/p50/p95 {h['mean_ms']:.0f}/{h['p50_ms']:.0f}/"
                  f"{h['p95_ms']:.0f} ms")
    for line in slowest(records):
        print(line)
    print(f"wrote {args.out / 'livetest.json'}")
    return 1 if summary["errors"] == summary["turns"] else 0


def slowest(records: list[dict], n: int = 3) -> list[str]:
    """The n turns slowest to their first audio, each with when it started in the run (turns slow together point at
    a moment of the server's, one alone at its session), its socket's connect and when its sentence was complete."""
    timed = [r for r in records if r.get("first_audio_ms") is not None]
    if not timed:
        return []
    begin = min(r["started_unix"] for r in timed)
    return [f"slow turn: first audio {r['first_audio_ms']:.0f} ms, started +{r['started_unix'] - begin:.2f} s into the "
            f"run, connect {r['connect_ms']:.0f} ms, first sentence complete {r['complete_ms']:.0f} ms after start"
            for r in sorted(timed, key=lambda r: -r["first_audio_ms"])[:n]]


if __name__ == "__main__":
    raise SystemExit(main())
