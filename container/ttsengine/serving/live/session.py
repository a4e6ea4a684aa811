"""One live session, whatever the wire protocol: the `start` request (fish-speech's /v1/tts body, plus the
fields Fish Audio's live clients send), text pieces cut into segments (segmenter.py), each segment submitted to
the engine in order once the one before has finished, with the voice and the previous segment (its text and
codes) as context, as long-text synthesis chains its chunks, and one encoder for the whole session, so the audio
is one continuous stream in the requested format and rate. cancel() (barge-in) drops the queued segments and
stops the running one; the engine frees its slot within a step.

Segments are separate engine requests: the previous segment's context goes in as a reference (its transcript
and kept codes), which is the prompt the engine builds for a chained chunk (Planner.chunk_prompt). Without a
seed in the request the session draws one and uses it for every segment.

audio() yields the encoded bytes and, after each segment's audio, that Segment (its text and the samples it made),
so an adapter can time segments and tell clients about them from the one stream it sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from pydantic import Field

from ...errors import Abandoned, InputError, NoAudio
from ...synthesis.request import Reference
from ...synthesis.stream import Stream
from ..delivery import encoder_for, scaled
from ..protocol import FishTTSRequest, SpeechJob, fish_job, validate
from ..voices import VoiceStore
from .segmenter import Segmenter

_DONE = object()
# of the audio a listener still has to play when a next segment is submitted, what that segment's first audio may
# not use (its own prefill and first chunk under load, with room to spare): the rest is its slack_s
SLACK_MARGIN_S = 1.0
log = logging.getLogger(__name__)


class LiveRequest(FishTTSRequest):
    """The `request` of a `start` event: /v1/tts's body (text may be empty: it comes in `text` events), plus
    what fish-audio-sdk's TTSRequest always sends."""

    text: str = ""
    min_chunk_length: int | None = None  # accepted and ignored: segments are cut at sentence ends
    condition_on_previous_chunks: bool = Field(True, description="false: each segment without the one before")
    early_stop_threshold: float | None = None  # accepted and ignored
    segment_events: bool = Field(False, description="ours: a `segment` event (text, start_sample, end_sample) "
                                 "after each segment's audio")


@dataclass
class Segment:
    """One segment as spoken. [start_sample, end_sample): the samples of the session's audio it made, at the
    output rate, from the engine's own sample counts scaled by the rate change and the speed (as captions are
    timed: exact at the model's rate and speed 1.0). ready_at: time.perf_counter() when it was taken to be
    submitted (its text complete and the segment before it done)."""

    text: str
    ready_at: float
    start_sample: int
    end_sample: int | None = None  # None while it is spoken
    submitting_at: float | None = None  # its submit began (~ready_at for a Service; a bare engine's: in a thread)
    taken_at: float | None = None  # the engine took it (planned and queued)


def live_job(body: Mapping, voices: VoiceStore | None, strict: bool = True) -> tuple[SpeechJob, LiveRequest]:
    """A start event's request -> the job every segment is made from; InputError names a bad field."""
    if not isinstance(body, Mapping):
        raise InputError("start: `request` must be a map (a /v1/tts request body)")
    req = validate(LiveRequest, dict(body), strict)
    job = fish_job(req, voices)
    if job.request.seed is None:
        job = dataclasses.replace(job, request=dataclasses.replace(job.request, seed=secrets.randbits(63)))
    return job, req


class LiveSession:
    def __init__(self, submit: Callable[..., Stream | Awaitable[Stream]], job: SpeechJob, *, max_chars: int,
                 chain: bool = True, first_text: str = ""):
        """submit: the engine's. Either a coroutine function admit(request, gone) -> Stream (Service.admit: with the
        engines in processes of their own the event loop hands the segment over, no thread waits on the round trip;
        gone() says whether the session was cancelled meanwhile), or submit(request, abandoned=) -> Stream (a bare
        Engine's or Fleet's), called in a thread. Told apart by inspect.iscoroutinefunction: pass an `async def`
        (a function or method), not a lambda or an object returning a coroutine."""
        self.job, self.chain, self.max_chars = job, chain, max_chars
        self._submit = submit
        self._admits = inspect.iscoroutinefunction(submit)
        self._segmenter = Segmenter(job.request.chunk_length or 200)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._chars = 0
        self._stream: Stream | None = None
        self._context: Reference | None = None
        self._last: Stream | None = None  # the latest segment's stream (stopped() waits for its end)
        self._native = 0  # samples the engine made in this session, at the model's rate
        self.native_rate = 0  # the model's rate (its audio's), known once the first segment is submitted
        self._first_audio_at: float | None = None  # time.perf_counter() of the session's first audio handed on
        self.current: Segment | None = None  # the segment whose audio audio() yields now
        self.ended = False  # stop came: no more text
        self.cancelled = False
        self.segments = 0  # submitted so far
        if first_text:
            self.text(first_text)

    @property
    def working(self) -> bool:
        """A segment is being made."""
        return self._stream is not None

    # ---- the client's events -----------------------------------------------------------------------------
    def text(self, text: str) -> None:
        if self.ended:
            raise InputError("text after stop: start a new session")
        self._chars += len(text)
        if self._chars > self.max_chars:
            raise InputError(f"the session's text passed {self.max_chars} characters (TTS_LIVE_MAX_CHARS)")
        self._queue_all(self._segmenter.feed(text))

    def flush(self) -> None:
        self._queue_all(self._segmenter.flush())

    def end(self) -> None:
        """stop: the pending text is spoken, then the audio ends."""
        if not self.ended:
            self.flush()
            self.ended = True
            self._queue.put_nowait(_DONE)

    def cancel(self) -> None:
        """Barge-in: nothing more is spoken; the running segment stops within one engine step."""
        self.cancelled = True
        if self._stream is not None:
            self._stream.cancel()
        self._queue.put_nowait(_DONE)

    def _queue_all(self, segments: list[str]) -> None:
        for segment in segments:
            if any(c.isalnum() for c in segment):  # "..." or "**" alone is nothing to say
                self._queue.put_nowait(segment)

    # ---- the audio --------------------------------------------------------------------------------------
    async def audio(self) -> AsyncIterator[bytes | Segment]:
        """Encoded audio, segment after segment, until stop's segments are spoken (or cancel). An engine error
        (a segment's bad text, a full engine) is raised; a segment the model ended at once (NoAudio, HTTP's 422)
        is skipped: in a conversation one silent sentence should not end the session."""
        enc = None
        try:
            while not self.cancelled:
                segment = await self._queue.get()
                if segment is _DONE or self.cancelled:
                    break
                self.current = Segment(segment, time.perf_counter(), self._out(enc))
                try:
                    stream = await self._start(segment)
                except Abandoned:  # cancelled (barge-in, the socket gone) while its references were encoded
                    break
                self._stream = stream
                if self.cancelled:
                    break
                if enc is None:
                    enc = encoder_for(self.job, stream.sample_rate)
                    self.native_rate = stream.sample_rate
                try:
                    async for chunk in stream:
                        if self.cancelled:
                            break
                        self._native += len(chunk.audio)
                        data = await enc.encode(scaled(chunk.audio, self.job.volume))
                        if data and not self.cancelled:
                            if self._first_audio_at is None:
                                self._first_audio_at = time.perf_counter()
                            yield data
                    else:
                        self._context = self._next_context(stream)
                except NoAudio:  # the model ended this segment at once: the next ones are still spoken
                    log.warning("live segment %d made no audio; the session goes on", self.segments)
                    self._context = None
                self._stream = None
                if not self.cancelled:
                    self.current.end_sample = self._out(enc)
                    yield self.current
            if enc is not None and not self.cancelled:
                tail = await enc.finish()
                if tail:
                    yield tail
        finally:
            if self._stream is not None and not self._stream.done:
                self._stream.cancel()  # left early (cancel, an error, the socket gone): free the slot now
            if enc is not None:
                enc.close()  # an encoder in a worker process: its state goes (nothing after finish)

    def slack(self, now: float | None = None) -> float:
        """Seconds the next segment's first audio may wait without the listener waiting: the audio made so far (at
        the job's speed) less what has played since the first audio (played at 1x from there on: a client that
        buffers more only has more), less SLACK_MARGIN_S; 0 before any audio (a session's first segment: the
        listener is waiting)."""
        if self._first_audio_at is None or not self.native_rate:
            return 0.0
        played = (time.perf_counter() if now is None else now) - self._first_audio_at
        made = self._native / (self.native_rate * self.job.speed)
        return max(0.0, made - played - SLACK_MARGIN_S)

    async def _start(self, segment: str) -> Stream:
        current = self.current
        refs = self.job.request.references + ((self._context,) if self._context is not None else ())
        # the kept codes become the next segment's context
        # admitted: after its first segment a session is a conversation under way; goodput admission refuses new
        # sessions at capacity, never the next sentence of one that is speaking
        request = dataclasses.replace(self.job.request, text=segment, references=refs, keep_codes=self.chain,
                                      admitted=self.segments > 0, slack_s=self.slack())
        # gone / abandoned: a session cancelled while this is planned stops before its next reference is encoded
        if self._admits:
            self._submitting(current)
            stream = await self._submit(request, self._gone)
        else:
            def in_thread() -> Stream:
                self._submitting(current)
                return self._submit(request, abandoned=self._is_cancelled)

            stream = await asyncio.to_thread(in_thread)
        self.segments += 1
        self._last = stream
        if current is not None:
            current.taken_at = time.perf_counter()
        return stream

    @staticmethod
    def _submitting(segment: Segment | None) -> None:
        if segment is not None:
            segment.submitting_at = time.perf_counter()

    def _is_cancelled(self) -> bool:
        return self.cancelled

    async def _gone(self) -> bool:
        return self.cancelled

    def _out(self, enc) -> int:
        """The engine's samples so far, in output samples (the encoder's rate, the job's speed)."""
        if enc is None or not self._native:
            return 0
        return round(self._native * enc.rate / (self.native_rate * self.job.speed))

    async def stopped(self, timeout: float = 10.0) -> None:
        """Until the engine has ended the latest segment (after cancel: its slot is free), at most `timeout` s."""
        stream = self._last
        if stream is None or stream.done:
            return

        async def drain():
            with contextlib.suppress(Exception):  # its end may be an error: it ended all the same
                async for _ in stream:
                    pass

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(drain(), timeout)

    def _next_context(self, stream: Stream) -> Reference | None:
        plan = stream.plan
        if not self.chain or len(plan.codes) != len(plan.texts) or plan.codes[-1].shape[1] == 0:
            return None
        return Reference(text=plan.texts[-1], codes=plan.codes[-1])
