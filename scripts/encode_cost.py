"""CPU cost of turning engine audio into bytes, per format, through AudioEncoder: CPU seconds per audio second
for one stream and for many streams encoded at once (threads, as the server's to_thread path does), plus a
breakdown of one chunk's stages (conditioning: tempo + resampling; the writer). Runs on CPU, no model.

    PYTHONPATH=container python scripts/encode_cost.py [--seconds 20] [--streams 1,16] [--formats mp3,opus]
    PYTHONPATH=container python scripts/encode_cost.py --pool 1 --streams 16   # through StreamEncoder

With --pool N the streams go through StreamEncoder as delivery.py runs them (one event loop; pcm and wav inline,
the rest in N encoder worker processes) and the table splits the CPU between the event loop's thread, this whole
process and the workers; --resample-thread hands pcm and wav whose rate changes to the resampler threads (feature
resample_thread), as the servers do with it on.

Chunks are what the engine emits: 4 codec frames, then 4, then 8 frames each (TTS_FIRST_CHUNK_FRAMES=4,
TTS_STREAM_CHUNK_FRAMES=8), 2048 samples a frame at 44.1 kHz (21.5 frames a second).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

import numpy as np

from ttsengine.audio import encoder_pool
from ttsengine.audio.encode import FORMATS, AudioEncoder
from ttsengine.audio.stream_encoder import StreamEncoder, resampler_threads

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


def worker_cpu(pool: encoder_pool.EncoderPool) -> float:
    """CPU seconds the pool's live workers have used (user + system, from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for w in pool.workers():
        with open(f"/proc/{w.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def pooled_cost(fmt: str, parts: list[np.ndarray], streams: int, pool,
                resampler=None) -> tuple[float, float, float, float]:
    """(the event loop thread's CPU s, this process's, the workers', wall s) per audio s, `streams` at once on one
    event loop."""
    audio = sum(len(c) for c in parts) / RATE * streams

    async def one() -> None:
        enc = StreamEncoder(fmt, RATE, pool=pool, resampler=resampler)
        for c in parts:
            await enc.encode(c)
        await enc.finish()

    async def run() -> None:
        await asyncio.gather(*(one() for _ in range(streams)))

    loop, cpu, work, wall = time.thread_time(), time.process_time(), worker_cpu(pool), time.perf_counter()
    asyncio.run(run())  # on this thread: thread_time() is the event loop's CPU
    return ((time.thread_time() - loop) / audio, (time.process_time() - cpu) / audio,
            (worker_cpu(pool) - work) / audio, (time.perf_counter() - wall) / audio)


def main_pool(args, parts: list[np.ndarray]) -> None:
    pool = encoder_pool.start(args.pool)
    counts = [int(s) for s in args.streams.split(",")]
    resampler = resampler_threads() if args.resample_thread else None
    pooled_cost("mp3", parts[:2], 1, pool)  # the workers' imports outside the timings
    print(f"{len(parts)} chunks, {args.seconds:g} s per stream, {args.pool} worker process(es), resampler threads "
          f"{'on' if resampler else 'off'}; CPU s and wall s per audio s:")
    print(f"{'format':6}" + "".join(f" {f'loop x{n}':>9} {f'srv x{n}':>9} {f'wrk x{n}':>9} {f'wall x{n}':>9}"
                                     for n in counts))
    for fmt in args.formats.split(","):
        row = f"{fmt:6}"
        for n in counts:
            row += " {:9.4f} {:9.4f} {:9.4f} {:9.4f}".format(*pooled_cost(fmt, parts, n, pool, resampler))
        print(row, flush=True)
    encoder_pool.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="audio seconds per stream")
    p.add_argument("--streams", default="1,16", help="comma-separated numbers of concurrent streams")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--pool", type=int, default=0, help="encoder worker processes (0: AudioEncoder in threads)")
    p.add_argument("--resample-thread", action="store_true", help="with --pool: feature resample_thread on")
    args = p.parse_args()
    parts = chunks(args.seconds)
    if args.pool:
        return main_pool(args, parts)
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
