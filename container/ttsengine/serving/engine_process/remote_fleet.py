"""The front side: a Fleet look-alike whose engines run in a child process (host.py). The Service holds it as it
holds a Fleet: submit -> Stream, stats, ready, failure, max_streams, open_streams, voice codes, close.

Streams are ordinary synthesis Streams filled by one reader thread: the front stamps submit and arrival times
itself (what a client meets), the engine's first prefill time comes with the audio. A stream's cancel() is a
CANCEL message. If the engine process dies, every open stream ends with EngineDown and the fleet reports the
failure (health: failed), as an in-process fleet does when its last engine fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection

from ...config import EngineConfig, visible_gpus, with_visible_gpus
from ...engine import features
from ...engine.placement import gpu_view
from ...engine.stats import FleetStats
from ...errors import Abandoned, EngineDown
from ...synthesis.plan import ChunkReport
from ...synthesis.request import SynthesisRequest
from ...synthesis.stream import Stream
from ..delivery import unless_left
from .wire import ACCEPTED, AUDIO, CALL, CANCEL, CLOSE, END, FAILED, LOADED, REFUSED, REPLY, STATE, SUBMIT, unpack_error

log = logging.getLogger(__name__)
SUBMIT_TIMEOUT = 120.0  # seconds for the engine to take or refuse a request (a long reference is encoded first)
ABANDON_POLL = 0.1  # seconds between checks, while the engine plans a request, whether its client left
CALL_TIMEOUT = 30.0
CLOSE_TIMEOUT = 60.0  # the engines end what is left and free the GPU


class RemotePlan:
    """What the front knows of a request's plan: the parts of synthesis.plan.Plan its readers use."""

    def __init__(self, request: SynthesisRequest):
        self.request = request
        self.texts: list[str] = []
        self.seed: int = request.seed if request.seed is not None else 0
        self.reports: list[ChunkReport] = []
        self.keep_codes = request.keep_codes
        self.codes: list = []  # int64 [num_codebooks, kept frames] per text chunk, when keep_codes

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.reports)


class RemoteFleet:
    engines_elsewhere = True  # the engines live in processes of their own (Service: this front freezes its heap)

    def __init__(self, process: subprocess.Popen, conn: Connection, facts: dict, names: dict[str, str] | None = None):
        """names: the engine process's device names -> the front's (feature own_gpu_view), for its stats."""
        self.process, self.conn, self.facts = process, conn, facts
        self.names = names or {}
        self.streams: dict[int, Stream] = {}
        self._submits: dict[int, Future] = {}
        self._calls: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the three tables
        self._send_lock = threading.Lock()  # one writer on the socket at a time
        self.dead: str | None = None  # why the engine process is gone
        self._closing = False
        self._reader = threading.Thread(target=self._read, name="engine-process-reader", daemon=True)
        self._reader.start()

    # ---- start ---------------------------------------------------------------------------------------
    @classmethod
    def spawn(cls, config: EngineConfig, random_weights: str | None = None) -> RemoteFleet:
        """Starts the engine process and returns once its first engine is warm; raises what its loading raised
        (or EngineDown if it died without saying). random_weights: bench's --random-weights (Fleet.load's; seeded, so
        every process draws the same weights)."""
        env, names = None, {}
        if not features.switched_off(config.features, features.OWN_GPU_VIEW):
            view = gpu_view(config.devices, visible_gpus())
            if view.visible is not None:
                env, names = with_visible_gpus(view.visible), view.names
                log.info("the engine process for %s sees GPU(s) %s as %s", config.devices, view.visible, view.devices)
                config = config.with_(devices=view.devices)
        front, back = socket.socketpair()
        cmd = [sys.executable, "-m", "ttsengine.serving.engine_process.host", str(back.fileno())]
        process = subprocess.Popen(cmd, pass_fds=(back.fileno(),), stdin=subprocess.DEVNULL, env=env)
        back.close()
        conn = Connection(front.detach())
        try:
            conn.send((config, logging.getLevelName(logging.getLogger().getEffectiveLevel()), random_weights))
            while True:
                for msg in conn.recv():
                    if msg[0] == LOADED:
                        return cls(process, conn, msg[1], names)
                    if msg[0] == FAILED:
                        process.wait(CLOSE_TIMEOUT)
                        raise unpack_error(msg[1])
        except (EOFError, OSError):
            code = process.wait(CLOSE_TIMEOUT)
            raise EngineDown(f"the engine process exited with code {code} while loading (its log says why)") from None
        except BaseException:
            conn.close()
            if process.poll() is None:
                process.kill()
                process.wait()
            raise

    # ---- requests ------------------------------------------------------------------------------------
    def submit(self, request: SynthesisRequest, *, ignore_stop: bool = False,
               abandoned: Callable[[], bool] | None = None) -> Stream:
        """Like Fleet.submit: the stream once the engine took the request; InputError, BusyError, EngineDown...
        raised as the engine raised them. abandoned(): asked while the engine plans it; once True the engine
        process is told (CANCEL: it drops the request, or stops before its next reference) and Abandoned raised."""
        sid, stream, taken = self._register(request)
        end = time.monotonic() + SUBMIT_TIMEOUT
        try:
            self._tell((SUBMIT, sid, request, ignore_stop))
            while True:
                try:
                    answer = taken.result(ABANDON_POLL if abandoned is not None else SUBMIT_TIMEOUT)
                    break
                except FutureTimeout:
                    if abandoned is not None and abandoned():
                        stream.cancel()
                        raise Abandoned("the client left before the request was taken in") from None
                    if time.monotonic() >= end:
                        stream.cancel()
                        raise EngineDown(f"the engine process did not take the request within {SUBMIT_TIMEOUT:.0f} "
                                         "s") from None
        finally:
            with self._lock:
                self._submits.pop(sid, None)
        return self._taken(stream, *answer)

    async def admit(self, request: SynthesisRequest, gone: Callable[[], Awaitable[bool]] | None = None, *,
                    ignore_stop: bool = False) -> Stream:
        """submit() on the event loop, no thread: the SUBMIT goes out now and the loop awaits the engine's answer.
        A front thread would only wait for that round trip, and a pool of them queued a burst's requests behind
        each other's (stop 58: 256 arriving at once waited up to 0.27 s p95 before the engine process saw them).
        gone(): asked every delivery.POLL seconds meanwhile; once it says the client left, the engine process is
        told (CANCEL) and Abandoned raised. The send is a few hundred bytes: requests with reference audio to send
        go through submit() in a planning thread (Service.admit)."""
        sid, stream, taken = self._register(request)
        waiting = asyncio.wrap_future(taken)
        waiting.add_done_callback(_retrieved)  # an answer nobody awaits any more (a timeout, a client gone)
        try:
            self._tell((SUBMIT, sid, request, ignore_stop))
            answer = await asyncio.wait_for(
                unless_left(waiting, gone, "the client left before the request was taken in"), SUBMIT_TIMEOUT)
        except asyncio.TimeoutError:
            stream.cancel()
            raise EngineDown(f"the engine process did not take the request within {SUBMIT_TIMEOUT:.0f} s") from None
        except BaseException:
            refused = waiting.done() and not waiting.cancelled() and waiting.exception() is not None
            if not refused:  # Abandoned, a cancelled task: the engine may hold it (a refused one it does not: no
                stream.cancel()  # CANCEL, which the engine process would keep as one still to come)
            raise
        finally:
            with self._lock:
                self._submits.pop(sid, None)
        return self._taken(stream, *answer)

    def _register(self, request: SynthesisRequest) -> tuple[int, Stream, Future]:
        """A new request's id, its front-side stream and the future its ACCEPTED or REFUSED resolves."""
        sid = next(self._ids)
        plan = RemotePlan(request)
        stream = Stream(plan, self.sample_rate, on_cancel=lambda: self._tell((CANCEL, sid)))
        taken: Future = Future()
        with self._lock:
            if self.dead:
                raise EngineDown(self.dead)
            self.streams[sid], self._submits[sid] = stream, taken
        return sid, stream, taken

    def _taken(self, stream: Stream, texts: list[str], seed: int, device: str, marks: dict) -> Stream:
        """The stream of a request the engine took, with what its ACCEPTED said."""
        plan = stream.plan
        plan.texts, plan.seed, stream.device = texts, seed, self.names.get(device, device)
        stream.marks.update(marks)
        return stream

    def synthesize(self, request: SynthesisRequest):
        return self.submit(request).result()

    def _tell(self, msg: tuple) -> None:
        try:
            with self._send_lock:
                self.conn.send([msg])
        except (OSError, ValueError):
            if msg[0] != CANCEL:  # a cancel after the end has nothing left to stop
                raise EngineDown(self.dead or "the engine process is gone") from None

    def _ask(self, name: str, *args, timeout: float = CALL_TIMEOUT):
        rid = next(self._ids)
        answer: Future = Future()
        with self._lock:
            if self.dead:
                raise EngineDown(self.dead)
            self._calls[rid] = answer
        self._tell((CALL, rid, name, args))
        try:
            return answer.result(timeout)
        except FutureTimeout:
            raise EngineDown(f"the engine process did not answer {name} within {timeout:.0f} s") from None
        finally:
            with self._lock:
                self._calls.pop(rid, None)

    # ---- the reader ----------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                for msg in self.conn.recv():
                    self._dispatch(msg)
        except (EOFError, OSError):
            pass
        self._gone()

    def _dispatch(self, msg: tuple) -> None:
        tag = msg[0]
        if tag == AUDIO:
            _, sid, text_index, audio, started_at, first_audio_at, reports = msg
            stream = self.streams.get(sid)
            if stream is not None:
                stream.plan.reports.extend(reports)
                if stream.started_at is None:
                    stream.started_at = started_at
                stream.marks.setdefault("engine_audio", first_audio_at)  # its first chunk left the codec there
                stream.emit(audio, text_index)
        elif tag == END:
            _, sid, error, reports, codes, started_at = msg
            with self._lock:
                stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.plan.reports.extend(reports)
                if codes is not None:
                    stream.plan.codes.extend(codes)
                if stream.started_at is None:
                    stream.started_at = started_at
                stream.finish(unpack_error(error))
        elif tag in (ACCEPTED, REFUSED):
            with self._lock:
                taken = self._submits.get(msg[1])
                if tag == REFUSED:
                    self.streams.pop(msg[1], None)
            if taken is not None:
                if tag == ACCEPTED:
                    taken.set_result(msg[2:])
                else:
                    taken.set_exception(unpack_error(msg[2]))
        elif tag == REPLY:
            _, rid, ok, value = msg
            with self._lock:
                answer = self._calls.get(rid)
            if answer is not None:
                answer.set_result(value) if ok else answer.set_exception(unpack_error(value))
        elif tag == STATE:
            self.facts = {**self.facts, **msg[1]}

    def _gone(self) -> None:
        """The engine process ended (or closed its end): everything still waiting on it ends with EngineDown."""
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        why = "the engine process was closed" if self._closing else \
            f"the engine process exited unexpectedly (exit code {code}); the server must be restarted"
        with self._lock:
            self.dead = why
            streams, self.streams = list(self.streams.values()), {}
            waiting = list(self._submits.values()) + list(self._calls.values())
        if not self._closing:
            log.error("%s", why)
        for stream in streams:
            stream.finish(EngineDown(why))
        for future in waiting:
            if not future.done():
                future.set_exception(EngineDown(why))

    # ---- what the front reports ----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.dead is None and bool(self.facts["ready"])

    @property
    def failure(self) -> str | None:
        return self.dead if self.dead and not self._closing else self.facts["failure"]

    @property
    def max_streams(self) -> int:
        return self.facts["max_streams"] if self.ready else 0

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    @property
    def sample_rate(self) -> int:
        return self.facts["sample_rate"]

    @property
    def frame_rate(self) -> float:
        return self.facts["frame_rate"]

    @property
    def codec_tag(self) -> str:
        return self.facts["codec_tag"]

    def voice_codes(self, audio: bytes):
        return self._ask("voice_codes", audio)

    def forget_voice(self, text: str, codes) -> None:
        self._ask("forget_voice", text, codes)

    def stats(self) -> FleetStats:
        return self._ask("stats").renamed(self.names)

    def settle(self, timeout: float = 120.0) -> bool:
        return self._ask("settle", timeout, timeout=timeout + CALL_TIMEOUT)

    def wait_all(self, timeout: float | None = None) -> bool:
        return self._ask("wait_all", timeout, timeout=(timeout or 3600.0) + CALL_TIMEOUT)

    def close(self) -> None:
        """Tells the engines to close (what is still open ends with an error, as in one process) and waits for
        the process; kills it if it does not end."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(EngineDown):
            self._tell((CLOSE,))
        try:
            self.process.wait(CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not end within %.0f s: killed", CLOSE_TIMEOUT)
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        self.conn.close()


def _retrieved(future: asyncio.Future) -> None:
    """Marks an answer as read, so a refusal that came after its caller gave up is not logged as never retrieved."""
    if not future.cancelled():
        future.exception()
