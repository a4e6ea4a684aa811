"""A submitted request as its caller sees it: audio chunks arriving from the engine thread, iterated
with `for` (blocking) or `async for` (no thread per waiter), and `cancel()`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator

from ..errors import CancelledError
from .output import AudioChunk, SynthesisResult
from .plan import Plan

_END = object()


class Stream:
    def __init__(self, plan: Plan, sample_rate: int, device: str = "", on_cancel: Callable[[], None] | None = None):
        """on_cancel: called once on the first cancel() (a stream whose engine lives in another process tells it
        there: serving/engine_process)."""
        self.plan = plan
        self.sample_rate = sample_rate
        self.device = device  # the engine's, as its stats name it ("cuda:1"): a metrics label
        self.submitted_at = time.perf_counter()
        self.started_at: float | None = None  # its first prefill: the end of its wait in the queue
        self.first_audio_at: float | None = None
        self.arrivals: list[tuple[float, int]] = []  # (time.perf_counter(), samples) of each audio chunk emitted
        # time.perf_counter() of stages on the way to the first audio that only some paths see (the engine process:
        # "received" its SUBMIT read there, "planned" the engine took it, "engine_audio" its first chunk left the
        # codec there): the HTTP metrics' first-audio waterfall
        self.marks: dict[str, float] = {}
        self.finished_at: float | None = None
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._cancelled = False
        self._error: BaseException | None = None
        self._done = False
        self._count = 0
        self._on_cancel = on_cancel
        self._relay: Callable[[object], None] | None = None

    # ---- engine side (any thread) -------------------------------------------------------------
    def start(self) -> None:
        """Marks the first prefill (later text chunks are prefilled again: the first one counts)."""
        if self.started_at is None:
            self.started_at = time.perf_counter()

    def emit(self, audio, text_index: int) -> None:
        """Queues the next audio chunk (float32 [L])."""
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
        self.arrivals.append((now, len(audio)))
        self._push(AudioChunk(audio, self.sample_rate, self._count, text_index))
        self._count += 1

    def finish(self, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._error = error
        self.finished_at = time.perf_counter()
        self._push(_END)

    def relay(self, sink: Callable[[object], None]) -> None:
        """From now on every item goes to sink(item) in the pushing thread instead of this stream's queue: an
        AudioChunk, then END (is_end) once; what was queued before goes first, under the lock, so nothing is lost
        or reordered. The engine process forwards its streams this way (no waiter thread or wake-up per chunk)."""
        with self._cond:
            for item in self._items:
                sink(item)
            self._items.clear()
            self._relay = sink

    @property
    def relayed(self) -> bool:
        """Whether items go to a relay's sink (from then on, for good) instead of this stream's queue."""
        return self._relay is not None

    @property
    def error(self) -> BaseException | None:
        """The error the stream ended with (None: none, or not ended)."""
        return self._error

    def _push(self, item) -> None:
        with self._cond:
            if item is _END:
                self._done = True
            if self._relay is not None:
                self._relay(item)
                return
            self._items.append(item)
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)

    # ---- caller side --------------------------------------------------------------------------
    @property
    def text_chunks(self) -> int:
        """How many text chunks the request was split into (one ChunkReport each when done)."""
        return len(self.plan.texts)

    @property
    def seed(self) -> int:
        return self.plan.seed

    @property
    def reports(self):
        return self.plan.reports

    @property
    def frames(self) -> int:
        """Kept frames so far (all of them once done)."""
        return self.plan.frames

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def done(self) -> bool:
        return self._done

    @property
    def queue_wait(self) -> float | None:
        """Seconds from submit to the first prefill (waiting for a slot)."""
        return None if self.started_at is None else self.started_at - self.submitted_at

    def waited(self, now: float) -> float:
        """Seconds this request waited for a slot: to its first prefill, or, if it never got one (the client left
        or it failed while queued), to `now` (time.perf_counter()): under load those are the longest waits."""
        return (self.started_at if self.started_at is not None else now) - self.submitted_at

    def stalls(self) -> float:
        """Seconds a listener playing the audio from its first chunk on, each chunk as it arrives, waits for audio
        after playback started (0: the stream kept ahead of playback)."""
        waited, until = 0.0, None  # until: when the audio arrived so far has played out
        for at, samples in self.arrivals:
            start = at if until is None else max(at, until)  # a chunk plays when it is there and the last is done
            if until is not None:
                waited += start - until
            until = start + samples / self.sample_rate
        return waited

    @property
    def ttfa(self) -> float | None:
        """Seconds from submit to the first audio chunk."""
        return None if self.first_audio_at is None else self.first_audio_at - self.submitted_at

    def cancel(self) -> None:
        """Stops generation; the engine frees the request's slot within one step."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._on_cancel is not None:
            self._on_cancel()

    def _take(self):
        item = self._items.popleft()
        if item is _END:
            self._items.appendleft(_END)  # stay exhausted
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def __iter__(self) -> Iterator[AudioChunk]:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                try:
                    item = self._take()
                except StopIteration:
                    return
            yield item

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[AudioChunk]:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    try:
                        item = self._take()
                    except StopIteration:
                        return
                else:
                    fut = loop.create_future()
                    self._waiters.append((loop, fut))
                    item = None
            if item is None:
                await fut
                continue
            yield item

    def result(self, on_chunk: Callable[[AudioChunk], None] | None = None) -> SynthesisResult:
        """Blocks until the request is done; raises its error (CancelledError if cancelled). on_chunk: called
        with each audio chunk as it arrives (progress)."""
        parts = []
        for chunk in self:
            parts.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        if self._cancelled:
            raise CancelledError("the request was cancelled")
        return SynthesisResult.join(parts, self.sample_rate, self.seed, self.plan.reports)


def is_end(item) -> bool:
    """Whether a relayed item is the end of its stream (Stream.relay)."""
    return item is _END


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)

