"""A delivered stream's encoder, behind one async interface whatever runs it.

Where a chunk is encoded (scripts/encode_cost.py measures the costs):
- inline, on the event loop: pcm and wav at speed 1.0. Their writer is a numpy clip-and-convert, with soxr
  when the rate changes: tens of microseconds for an 8-frame chunk on a quiet CPU, less than a thread hop costs
  under load (the pool's queue and the GIL, which the engine's threads share);
- a resampler thread (feature resample_thread, given as `resampler`): pcm and wav whose rate changes. At 256 pcm
  streams the HTTP front's event loop spent most of its busy time in soxr's resampling (docs/performance.md,
  "The HTTP path (issue 43)"); soxr runs without the GIL, so a thread takes that off the loop for one hop;
- a worker process of the pool (audio/encoder_pool.py), when TTS_ENCODER_PROCESSES > 0: everything else (LAME,
  Opus, AAC: milliseconds per chunk; FLAC written whole at the end; the WSOLA tempo change, ~1-2 ms a chunk),
  so that codec CPU runs outside this process's GIL;
- a worker thread (asyncio.to_thread), when the pool is off (TTS_ENCODER_PROCESSES=0): what every format did
  before the pool.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from .encode import AudioEncoder
from .encoder_pool import EncoderPool, PooledEncoder

INLINE_FORMATS = ("pcm", "wav")
RESAMPLER_THREADS = 2  # one stream's chunks go one at a time; two threads keep a slow chunk from holding up others
_resampler: ThreadPoolExecutor | None = None
_resampler_lock = threading.Lock()


def resampler_threads() -> ThreadPoolExecutor:
    """The process's resampler threads (feature resample_thread), started at first use."""
    global _resampler
    with _resampler_lock:
        if _resampler is None:
            _resampler = ThreadPoolExecutor(RESAMPLER_THREADS, thread_name_prefix="resampler")
        return _resampler


class StreamEncoder:
    """One stream's encoder (AudioEncoder's arguments): await encode(chunk) for the bytes ready so far, await
    finish() for the rest, close() when the stream is abandoned (frees its state in a worker process).
    pool: the worker processes (None: worker threads); a callable is asked only when the stream needs it, so a
    pcm stream never starts the pool. resampler: where a pcm or wav stream whose rate changes is encoded (None:
    inline; feature resample_thread passes resampler_threads())."""

    def __init__(self, fmt: str, native_rate: int, sample_rate: int | None = None, speed: float = 1.0,
                 streaming: bool = True, pool: EncoderPool | Callable[[], EncoderPool | None] | None = None,
                 resampler: Executor | None = None):
        args = (fmt, native_rate, sample_rate, speed, streaming)
        inline = fmt in INLINE_FORMATS and speed == 1.0
        if callable(pool):
            pool = None if inline else pool()
        pool = None if inline else pool
        self._enc: AudioEncoder | PooledEncoder
        if pool is not None:
            self._enc, self.where = pool.open(*args), "process"
        else:
            self._enc, self.where = AudioEncoder(*args), "inline" if inline else "thread"
        self._executor = resampler if self.where == "inline" and self._enc.rate != native_rate else None
        if self._executor is not None:
            self.where = "resampler"
        self.fmt, self.rate, self.content_type = fmt, self._enc.rate, self._enc.content_type

    @property
    def seconds(self) -> float:
        """Output audio so far (after the speed change and resampling)."""
        return self._enc.seconds

    async def encode(self, chunk: np.ndarray) -> bytes:
        """chunk: [n] float32 mono at the native rate."""
        if self.where == "process":
            return await self._enc.encode(chunk)
        return await self._run(self._enc.encode, chunk)

    async def finish(self) -> bytes:
        if self.where == "process":
            return await self._enc.finish()
        return await self._run(self._enc.finish)

    async def _run(self, fn: Callable[..., bytes], *args) -> bytes:
        """An in-process encoder call where this stream encodes: inline, a resampler thread or a worker thread."""
        if self.where == "inline":
            return fn(*args)
        if self.where == "resampler":
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        if self.where == "process":
            self._enc.close()  # nothing to do after finish()
