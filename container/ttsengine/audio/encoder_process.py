"""One encoder worker process, seen from the serving process: the child (encoder_worker.py, started as a fresh
interpreter: no fork of a process with CUDA and threads, no re-import of the server's __main__ as
multiprocessing's spawn does), two pipes, and two threads that keep blocking pipe I/O off the event loop:
- the writer sends queued requests (a 64 KB chunk can fill the pipe while the worker is busy);
- the reader takes replies and settles their futures on the loop that asked (call_soon_threadsafe), so one
  pool serves any number of event loops (the HTTP server's, RunPod's, a test client's portal thread).
When the worker dies, every request waiting on it fails with EncoderFailed and so does any later one: its
streams' encoder state is gone. The pool (encoder_pool.py) starts a new worker for new streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from ..errors import TTSError
from . import encoder_wire as wire

log = logging.getLogger(__name__)
WORKER = Path(__file__).with_name("encoder_worker.py")


class EncoderFailed(TTSError):
    """A stream's encoder worker process died or its encoder raised: the stream cannot go on (500)."""


class EncoderProcess:
    def __init__(self, name: str, on_exit: Callable[[EncoderProcess], None] | None = None):
        self.name = name
        self.streams = 0  # streams assigned and not yet finished or dropped (the pool's load measure)
        self.failure: str | None = None  # why it is unusable: set once, when it died or was closed
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}  # request id -> waiter
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        child_in, to_child = os.pipe()  # non-inheritable: only pass_fds reach the child, no sibling holds them
        from_child, child_out = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, str(WORKER), str(child_in), str(child_out)],
                                         pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL)
        except BaseException:
            os.close(to_child)
            os.close(from_child)
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        self._out = Connection(to_child, readable=False)
        self._in = Connection(from_child, writable=False)
        for target, role in ((self._write_loop, "writer"), (self._read_loop, "reader")):
            threading.Thread(target=target, name=f"{name}-{role}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    # ---- requests (on an event loop) ------------------------------------------------------------------------
    def send(self, op: int, stream: int, payload: bytes = b"") -> None:
        """A request without a reply (OPEN, DROP); dropped silently once the worker is gone."""
        if self.failure is None:
            self._outbox.put(wire.request(op, stream, 0, payload))

    def call(self, op: int, stream: int, payload: bytes = b"") -> asyncio.Future:
        """A request answered by the worker: the future's result is (output samples so far, encoded bytes)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        req = next(self._ids)
        with self._lock:
            if self.failure is not None:
                raise EncoderFailed(self.failure)
            self._pending[req] = (loop, fut)
        self._outbox.put(wire.request(op, stream, req, payload))
        return fut

    # ---- the threads ----------------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (msg := self._outbox.get()) is not None:
            try:
                self._out.send_bytes(msg)
            except OSError:  # the worker is gone: the reader sees its end and fails the waiters
                break
        self._out.close()  # EOF: the worker exits once it has answered what it read

    def _read_loop(self) -> None:
        while True:
            try:
                msg = self._in.recv_bytes()
            except (EOFError, OSError):
                break
            req, ok, samples = wire.REPLY.unpack_from(msg)
            data = msg[wire.REPLY.size:]
            with self._lock:
                waiter = self._pending.pop(req, None)
            if waiter is not None:
                result, error = ((samples, data), None) if ok else (None, EncoderFailed(data.decode()))
                _settle(*waiter, result, error)
        code = self.proc.wait()
        self._in.close()
        self._fail(f"the audio encoder process ({self.name}, pid {self.pid}) exited with code {code}")

    def _fail(self, why: str) -> None:
        with self._lock:
            closing = self.failure is not None
            self.failure = self.failure or why
            waiters, self._pending = list(self._pending.values()), {}
        self._outbox.put(None)  # ends the writer thread
        for loop, fut in waiters:
            _settle(loop, fut, None, EncoderFailed(self.failure))
        if not closing:
            log.error("%s; its streams fail, new streams go to a new worker", why)
            if self._on_exit is not None:
                self._on_exit(self)

    def close(self, timeout: float = 5.0) -> None:
        """Stops the worker: it answers what it has already read, then exits; killed after `timeout` s."""
        with self._lock:
            self.failure = self.failure or f"the audio encoder process ({self.name}) was closed"
        self._outbox.put(None)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _settle(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, result, error: BaseException | None) -> None:
    """From a reader thread: resolve `fut` on its own loop (a waiter that was cancelled is left alone)."""
    def settle() -> None:
        if not fut.done():
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)
