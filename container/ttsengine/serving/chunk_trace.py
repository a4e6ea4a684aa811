"""Opt-in per-chunk timestamps, for finding where a stream's time goes between the engine and the socket.

Off unless the server starts with TTS_TRACE_CHUNKS=on (ServerConfig.trace_chunks: the HTTP adapter calls enable()
at start-up; the other adapters never do); off, nothing is recorded and no metric is added. When on, each piece of
audio a delivery hands on carries (emitted, picked, encoded): time.perf_counter() when the engine emitted the chunk,
when the event loop took it from the stream, and when its bytes were encoded (the worker thread's hop included); the
adapter adds the time its send returned (the bytes written to the transport, or buffered there, a paused transport's
wait included) and observes the stages:
- wake: emitted -> picked (the cross-thread wake-up and the event loop's backlog);
- encode: picked -> encoded (the thread pool's queue and the encoder);
- send: encoded -> sent (the ASGI send through the middleware and the server's transport);
- total: emitted -> sent.
"""

from __future__ import annotations

import time
from collections import deque

_enabled = False  # set once at start-up by the adapter (enable), before any delivery or metric is made
STAGES = ("wake", "encode", "send", "total")
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def enable(on: bool) -> None:
    """Turns tracing on or off for this process (the adapter, from its ServerConfig, at start-up)."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def new_marks() -> deque | None:
    """A delivery's queue of marks (None when tracing is off)."""
    return deque() if _enabled else None


def mark(marks: deque | None, emitted: float | None, picked: float) -> None:
    """One piece of audio encoded now: its marks go in the queue the adapter's send reads."""
    if marks is not None and emitted is not None:
        marks.append((emitted, picked, time.perf_counter()))


def stages(emitted: float, picked: float, encoded: float, sent: float) -> tuple[float, float, float, float]:
    """Seconds per stage, in STAGES' order."""
    return picked - emitted, encoded - picked, sent - encoded, sent - emitted


def job_summary(marks: list[tuple[float, float, float]], posts: list[tuple[float, float]]) -> str:
    """One streamed job's trace in a line (the RunPod worker logs it; it has no /metrics): marks are its chunks'
    (emitted, picked, encoded), posts its items' (handed to the SDK, the SDK asked for the next: its post answered).
    'arriving every' is the mean gap between the chunks' arrivals in this process (the engine's pace as the front sees
    it); the stages' mean / max; 'trail' how long after its chunk arrived the job's last audio was posted."""
    if not marks or not posts:
        return f"chunks {len(marks)}, pieces {len(posts)}: nothing to time"

    def ms(xs: list[float]) -> str:
        return f"{1000 * sum(xs) / len(xs):.1f} / {1000 * max(xs):.1f} ms"

    arrivals = [m[0] for m in marks]
    every = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0
    return (f"chunks {len(marks)}, pieces {len(posts)}, arriving every {1000 * every:.1f} ms, "
            f"wake {ms([p - e for e, p, _ in marks])}, encode {ms([c - p for _, p, c in marks])}, "
            f"post {ms([b - a for a, b in posts])}, trail {1000 * (posts[-1][1] - marks[-1][0]):.1f} ms")
