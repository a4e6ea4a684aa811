"""A pool of encoder worker processes, so that compressed formats (LAME, Opus, AAC: a few ms of CPU per chunk)
are encoded outside the serving process and its GIL, which the engine's threads and the event loop need.

Sticky: a stream's encoder is stateful (the codec's look-ahead, the container's pages), so it lives in one
worker for the stream's life; a new stream goes to the worker with the fewest open streams. A dead worker
fails only its own streams (EncoderFailed) and its place is taken by a new worker at the next stream.
PooledEncoder has AudioEncoder's interface (rate, content_type, seconds), with encode/finish as coroutines.

The process's pool (shared) starts lazily with the first stream that needs it, each worker with the first stream
given to it, or all at start(); close() stops it, and so does the interpreter's exit (atexit). Every worker's
input pipe closes with this process however it ends (SIGKILL too) and the worker exits then: no orphans.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
from collections.abc import Callable

import numpy as np

from . import encoder_wire as wire
from .encode import CONTENT_TYPES, check_output, output_rate
from .encoder_process import EncoderFailed, EncoderProcess


class EncoderPool:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"an encoder pool needs at least one process, got {size}")
        self.size = size
        self._lock = threading.Lock()  # streams open from any thread's event loop
        self._workers: list[EncoderProcess | None] = [None] * size  # None: not started yet, or died
        self._streams = itertools.count(1)
        self._closed = False
        self.started = 0  # worker processes started so far (respawns included)

    def start(self) -> None:
        """Starts every worker now (otherwise each starts with the first stream it is given)."""
        with self._lock:
            for i in range(self.size):
                self._worker(i)

    def open(self, fmt: str, native_rate: int, sample_rate: int | None = None, speed: float = 1.0,
             streaming: bool = True) -> PooledEncoder:
        """One stream's encoder in the least loaded worker. Arguments as AudioEncoder's; InputError as its."""
        check_output(fmt, sample_rate, speed)  # a bad request fails here, before anything is sent
        args = {"fmt": fmt, "native_rate": native_rate, "sample_rate": sample_rate, "speed": speed,
                "streaming": streaming}
        with self._lock:
            if self._closed:
                raise EncoderFailed("the audio encoder pool is closed (the server is stopping)")
            i = min(range(self.size), key=lambda k: self._load(k))
            worker = self._worker(i)
            worker.streams += 1
            stream = next(self._streams)
        worker.send(wire.OPEN, stream, json.dumps(args).encode())
        return PooledEncoder(worker, stream, fmt, output_rate(fmt, native_rate, sample_rate))

    def _load(self, i: int) -> int:
        w = self._workers[i]
        return 0 if w is None or w.failure is not None else w.streams

    def _worker(self, i: int) -> EncoderProcess:
        """Slot i's live worker, started when there is none (under the lock)."""
        w = self._workers[i]
        if w is None or w.failure is not None:
            try:
                w = self._workers[i] = EncoderProcess(f"audio-encoder-{i}")
            except OSError as e:  # out of processes or file descriptors: this stream fails, the server goes on
                raise EncoderFailed(f"could not start an audio encoder process: {e.strerror or e}") from e
            self.started += 1
        return w

    def workers(self) -> list[EncoderProcess]:
        with self._lock:
            return [w for w in self._workers if w is not None]

    def close(self) -> None:
        """Stops every worker (what they have read is answered first); new streams are refused after."""
        with self._lock:
            self._closed = True
            workers, self._workers = [w for w in self._workers if w is not None], [None] * self.size
        for w in workers:
            w.close()


class PooledEncoder:
    """One stream's encoder inside a worker process; one request at a time (the delivery awaits each)."""

    def __init__(self, worker: EncoderProcess, stream: int, fmt: str, rate: int):
        self.fmt, self.rate, self.content_type = fmt, rate, CONTENT_TYPES[fmt]
        self._worker, self._stream = worker, stream
        self._samples = 0  # output samples so far, as the worker counts them
        self._open = True

    @property
    def seconds(self) -> float:
        return self._samples / self.rate

    async def encode(self, chunk: np.ndarray) -> bytes:
        """chunk: [n] float32 mono at the native rate -> the bytes ready so far."""
        return await self._call(wire.ENCODE, np.ascontiguousarray(chunk, dtype=np.float32).tobytes())

    async def finish(self) -> bytes:
        data = await self._call(wire.FINISH, b"")
        self._release(drop=False)  # the worker forgot the stream with its last reply
        return data

    async def _call(self, op: int, payload: bytes) -> bytes:
        if not self._open:
            raise EncoderFailed("this stream's encoder has already finished")
        try:
            self._samples, data = await self._worker.call(op, self._stream, payload)
        except EncoderFailed:
            self._release(drop=False)  # the worker forgot it (its encoder raised) or is gone
            raise
        return data

    def close(self) -> None:
        """The stream was abandoned (a client that left, an engine error): its encoder in the worker goes."""
        self._release(drop=True)

    def _release(self, drop: bool) -> None:
        if self._open:
            self._open = False
            self._worker.streams -= 1
            if drop:
                self._worker.send(wire.DROP, self._stream)


# ---- the process's pool ------------------------------------------------------------------------------------
_lock = threading.Lock()
_pool: EncoderPool | None = None
_pool_pid = 0  # the process that made _pool: a forked child must not use its parent's pipes
_size: int | None = None  # start()'s; None: shared()'s default_size, asked at first use
_hooked = False


def start(processes: int) -> EncoderPool | None:
    """Sizes the process's pool (0: off, threads) and starts its workers now, so the first streams do not wait for
    them. For a server's start-up; without it the pool starts lazily at its default size."""
    global _size
    with _lock:
        _size = processes
        _drop_pool()
    pool = shared(lambda: processes)
    if pool is not None:
        pool.start()
    return pool


def close() -> None:
    """Stops the pool's workers (a server's shutdown, after its streams ended) and forgets start()'s size; a later
    stream starts a new pool at the default size."""
    global _size
    with _lock:
        _size = None
        _drop_pool()


def _drop_pool() -> None:
    global _pool
    pool, _pool = _pool, None
    if pool is not None and _pool_pid == os.getpid():
        pool.close()


def shared(default_size: Callable[[], int]) -> EncoderPool | None:
    """The process's encoder pool, made at the first call (None: size 0, encoding stays in threads); its size is
    start()'s, or else default_size() (the adapters' TTS_ENCODER_PROCESSES)."""
    global _pool, _pool_pid, _hooked
    with _lock:
        if _pool is not None and _pool_pid == os.getpid():
            return _pool
        size = default_size() if _size is None else _size
        if size <= 0:
            return None
        _pool, _pool_pid = EncoderPool(size), os.getpid()
        if not _hooked:
            _hooked = True
            atexit.register(close)
        return _pool
