"""CPU cost of turning engine audio into bytes, per format, through AudioEncoder: CPU seconds per audio second
for one stream and for many streams encoded at once (threads, as the server's to_thread path does), plus a
breakdown of one chunk's stages (conditioning: tempo + resampling; the writer). Runs on CPU, no model.

    PYTHONPATH=container python scripts/encode_cost.py [--seconds 20] [--streams 1,16] [--formats mp3,opus]

Chunks are what the engine emits: 4 codec frames, then 4, then 8 frames each (TTS_FIRST_CHUNK_FRAMES=4,
TTS_STREAM_CHUNK_FRAMES=8), 2048 samples a frame at 44.1 kHz (21.5 frames a second).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from ttsengine.audio.encode import FORMATS, AudioEncoder

RATE, FRAME = 44100, 2048


def chunks(seconds: float, seed: int = 0) -> list[np.ndarray]:
    """Speech-like float32 audio cut as the engine cuts it: [n] float32 chunks of 4, 4, 8, 8, ... frames."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    x = (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(n))
    x = x.astype(np.float32)
    out, at, k = [], 0, 0
    while at < n:
        size = (4 if k < 2 else 8) * FRAME
        out.append(x[at:at + size])
        at, k = at + size, k + 1
    return out


def one_stream(fmt: str, parts: list[np.ndarray]) -> int:
    enc = AudioEncoder(fmt, RATE)
    total = sum(len(enc.encode(c)) for c in parts)
    return total + len(enc.finish())


def cost(fmt: str, parts: list[np.ndarray], streams: int) -> tuple[float, float]:
    """(CPU s per audio s, wall s per audio s) with `streams` encoders running at once in threads."""
    audio = sum(len(c) for c in parts) / RATE * streams
    threads = [threading.Thread(target=one_stream, args=(fmt, parts)) for _ in range(streams)]
    cpu, wall = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.process_time() - cpu) / audio, (time.perf_counter() - wall) / audio


def stages(fmt: str, parts: list[np.ndarray]) -> tuple[float, float]:
    """(conditioning, writer) CPU microseconds per chunk, one stream."""
    enc = AudioEncoder(fmt, RATE)
    cond = write = 0.0
    for c in parts:
        t0 = time.process_time()
        x = enc._condition(c, last=False)
        t1 = time.process_time()
        enc._write(x, last=False)
        t2 = time.process_time()
        cond, write = cond + t1 - t0, write + t2 - t1
    return cond / len(parts) * 1e6, write / len(parts) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="audio seconds per stream")
    p.add_argument("--streams", default="1,16", help="comma-separated numbers of concurrent streams")
    p.add_argument("--formats", default=",".join(FORMATS))
    args = p.parse_args()
    parts = chunks(args.seconds)
    counts = [int(s) for s in args.streams.split(",")]
    one_stream("mp3", parts[:2])  # imports (av, soxr) outside the timings
    head = f"{'format':6} {'cond us/chunk':>13} {'write us/chunk':>14}"
    head += "".join(f" {f'cpu/aud x{n}':>11} {f'wall/aud x{n}':>12}" for n in counts)
    print(f"{len(parts)} chunks of 4/8 frames, {args.seconds:g} s per stream; CPU s and wall s per audio s")
    print(head)
    for fmt in args.formats.split(","):
        cond, write = stages(fmt, parts)
        row = f"{fmt:6} {cond:13.0f} {write:14.0f}"
        for n in counts:
            c, w = cost(fmt, parts, n)
            row += f" {c:11.4f} {w:12.4f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
