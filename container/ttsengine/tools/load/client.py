"""The load generator: one process's share of a level against /v1/audio/speech (closed or open loop), each
response's bytes timed as they arrive, and the process's own CPU seconds, so a busy client shows as such.
`run_share` is what each client process runs (a plain function: multiprocessing's spawn can call it). The HTTP
client is load/raw_http.py's ("raw", the default: little CPU per chunk) or httpx ("httpx", what many users run)."""

from __future__ import annotations

import asyncio
import io
import time

from .doors import PATHS, JsonLines, request_body
from .playback import first_stall, stalls
from .schedule import Share


def new_record() -> dict:
    """One request's record as it is filled: seconds since it was sent, its audio pieces (arrival, bytes)."""
    return {"ttfb": None, "first": None, "end": None, "pieces": [], "bytes": b"", "rate": 24000, "error": None}


def add_piece(out: dict, parts: list[bytes], now: float, audio: bytes) -> None:
    if audio:
        out["first"] = now if out["first"] is None else out["first"]
        out["pieces"].append((now, len(audio)))
        parts.append(audio)


async def _one(client, url: str, body: dict, headers: dict, door: str = "http") -> dict:
    t0 = time.perf_counter()
    out = new_record()
    lines = JsonLines() if door == "serve" else None
    try:
        async with client.stream("POST", url + PATHS[door], json=request_body(door, body), headers=headers) as r:
            out["ttfb"] = time.perf_counter() - t0
            if r.status_code != 200:
                out["error"] = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return out
            out["rate"] = int(r.headers.get("x-sample-rate", 24000))
            parts = []
            async for chunk in r.aiter_raw():
                if chunk:
                    add_piece(out, parts, time.perf_counter() - t0, chunk if lines is None else lines.feed(chunk))
            if lines is not None:
                if last := lines.close():
                    add_piece(out, parts, time.perf_counter() - t0, last)
                out["rate"] = lines.rate or out["rate"]
                if not lines.done:
                    out["error"] = "the stream ended without its closing {\"done\": ...} record"
            out["bytes"] = b"".join(parts)
        out["end"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - counted as an error of this request
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def audio_seconds(data: bytes, fmt: str, rate: int) -> float:
    """Seconds of audio in a whole response: pcm by its size, the others decoded."""
    if fmt == "pcm":
        return len(data) / 2 / rate
    import av

    with av.open(io.BytesIO(data)) as f:
        return sum(frame.samples for frame in f.decode(audio=0)) / f.streams.audio[0].rate


def finished(r: dict, fmt: str) -> dict:
    """A request's record without its bytes: times, audio seconds, stalls. Each piece's audio is its share of
    the bytes (exact for pcm; for the compressed formats the bitrate is taken as even over the stream)."""
    rec = {k: r[k] for k in ("ttfb", "first", "end", "error")}
    if r["error"] is None:
        seconds = audio_seconds(r["bytes"], fmt, r["rate"])
        total = sum(n for _, n in r["pieces"]) or 1
        rec["audio_s"] = seconds
        rec["pieces"] = len(r["pieces"])
        rec["last"] = r["pieces"][-1][0] if r["pieces"] else None  # the last audio's arrival (end: the request's)
        pieces = [(t, seconds * n / total) for t, n in r["pieces"]]
        rec["stalls"], rec["stall_s"] = stalls(pieces)
        rec["stall_at"] = first_stall(pieces)  # which piece: the second (1) points at the first chunk's audio
    return rec


async def closed_loop(share: Share, send, results) -> None:
    """send(i) -> request i's record; each of share.clients sends its next request when its last one ended."""
    queue = list(reversed(share.indices))

    async def worker():
        while queue:
            results.append(await send(queue.pop()))

    await asyncio.gather(*(worker() for _ in range(share.clients)))


async def open_loop(share: Share, send, results, lags) -> None:
    t0 = time.perf_counter()

    async def at(i, offset):
        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        lags.append(time.perf_counter() - t0 - offset)  # the generator's own lateness
        results.append(await send(i))

    await asyncio.gather(*(at(i, o) for i, o in zip(share.indices, share.offsets)))


CLIENTS = ("raw", "httpx")


def _client(kind: str, url: str, n: int, timeout: float):
    """-> an async context manager whose value has stream(method, url, json=, headers=) (n: concurrent requests)."""
    if kind == "raw":
        from .raw_http import RawClient

        return RawClient(url, timeout)
    import httpx

    limits = httpx.Limits(max_connections=max(1, n), max_keepalive_connections=max(1, n))
    return httpx.AsyncClient(timeout=timeout, limits=limits)


def seeded(body: dict, i: int) -> dict:
    """Request i of a level: its own seed, so no two requests of a run are the same."""
    return {**body, "seed": body.get("seed", 0) + i}


async def drive(share: Share, send) -> tuple[list, list]:
    """The share's requests, closed or open loop (send(i) -> request i's record) -> (records, the open loop's
    lateness)."""
    results, lags = [], []
    if share.offsets is None:
        await closed_loop(share, send, results)
    else:
        await open_loop(share, send, results, lags)
    return results, lags


async def _run(share: Share, url: str, body: dict, headers: dict, timeout: float, kind: str,
               door: str) -> tuple[list, list]:
    n = share.clients if share.offsets is None else len(share.indices)
    async with _client(kind, url, n, timeout) as client:
        return await drive(share, lambda i: _one(client, url, seeded(body, i), headers, door))


def timed_part(run, body: dict, late: float) -> dict:
    """run() -> (records, lags), timed: a level's part as summary.summarise takes it (records finished, the
    monotonic begin and end, the process's CPU seconds)."""
    begin, cpu0 = time.monotonic(), time.process_time()
    results, lags = run()
    end, cpu = time.monotonic(), time.process_time() - cpu0
    fmt = body.get("response_format", "pcm")
    return {"records": [finished(r, fmt) for r in results], "begin": begin, "end": end, "cpu_s": cpu,
            "late_start_s": max(0.0, late), "lags": lags}


def run_share(share: Share, url: str, body: dict, headers: dict, timeout: float, start_at: float,
              kind: str = "raw", door: str = "http") -> dict:
    """Waits for start_at (time.monotonic(), the same clock in every process), runs the share with the `kind` of
    client (CLIENTS), and returns its records, its start and end (monotonic), the generator's lateness (open loop)
    and its CPU seconds."""
    if kind == "httpx":
        import httpx  # noqa: F401 - imported before the start, not inside the timed part

    late = time.monotonic() - start_at
    if late < 0:
        time.sleep(-late)
    return timed_part(lambda: asyncio.run(_run(share, url, body, headers, timeout, kind, door)), body, late)
