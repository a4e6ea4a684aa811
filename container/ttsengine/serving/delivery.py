"""From an engine Stream to bytes on the wire, for any transport: encoded audio as it is produced,
OpenAI-style SSE events, or one whole file. Encoding goes through a StreamEncoder (stream_encoder.py): pcm and
wav inline, compressed formats in the encoder worker processes, so the event loop keeps serving other streams;
leaving an iterator early (a client that went away) cancels the generation.
A Tally, when given, keeps the account an adapter's metrics read: audio seconds out, when audio was first
handed on, and how the delivery ended.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ..audio import encoder_pool
from ..audio.encode import CONTENT_TYPES, EncodedAudio
from ..audio.stream_encoder import StreamEncoder, resampler_threads
from ..config import encoder_processes
from ..errors import Abandoned
from ..synthesis.output import SynthesisResult
from ..synthesis.stream import Stream
from . import chunk_trace
from .failure import failure
from .protocol import SpeechJob

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL = 0.25  # seconds between checks whether a client is still there (a whole answer, a request being planned)


@dataclass
class Tally:
    """One delivery's account, read by the adapter's metrics (any time: it is kept up to date).
    audio_seconds: encoded so far (after speed and resampling); first_audio_at: time.perf_counter() when the
    first audio bytes were handed on (None: none yet); outcome: ok | error | cancelled (left early), None while
    under way; marks: each handed-on piece's chunk_trace marks until the adapter sends it (None: tracing off)."""

    audio_seconds: float = 0.0
    first_audio_at: float | None = None
    outcome: str | None = None
    marks: deque | None = field(default_factory=chunk_trace.new_marks)

    def audio(self, enc: StreamEncoder, data: bytes) -> None:
        self.audio_seconds = enc.seconds
        if data and self.first_audio_at is None:
            self.first_audio_at = time.perf_counter()


@contextlib.contextmanager
def _delivering(stream: Stream, tally: Tally):
    """Around one delivery: the tally's outcome (ok, error, or cancelled when the consumer stopped early:
    GeneratorExit, a cancelled task), and the engine slot freed if the stream did not run to its end."""
    try:
        yield
        tally.outcome = "ok"
    except Exception:
        tally.outcome = "error"
        raise
    finally:
        if tally.outcome is None:
            tally.outcome = "cancelled"
        if not stream.done:
            stream.cancel()  # the consumer stopped early: free the engine slot


_resample_thread = True  # feature resample_thread (its default), set by the process's Service (use_resample_thread)


def use_resample_thread(on: bool) -> None:
    """Feature resample_thread for this process's deliveries from now on (Service, from TTS_FEATURES, at its
    construction: every adapter makes one)."""
    global _resample_thread
    _resample_thread = on


def encoder_for(job: SpeechJob, native_rate: int, streaming: bool = True) -> StreamEncoder:
    """The job's encoder; close() it when done (a worker process may hold its state)."""
    return StreamEncoder(job.format, native_rate, job.sample_rate, job.speed, streaming=streaming, pool=_pool,
                         resampler=resampler_threads() if _resample_thread else None)


def _pool() -> encoder_pool.EncoderPool | None:
    return encoder_pool.shared(encoder_processes)  # TTS_ENCODER_PROCESSES at first use; every adapter's


def start_encoders(processes: int | None = None) -> None:
    """A server's start-up (optional): the encoder worker processes start now rather than with the first streams
    that need them. processes None: TTS_ENCODER_PROCESSES; 0: encoding in threads."""
    encoder_pool.start(encoder_processes() if processes is None else processes)


def close_encoders() -> None:
    """A server's shutdown, after its streams ended (optional: the interpreter's exit does it too)."""
    encoder_pool.close()


def scaled(audio: np.ndarray, volume: float) -> np.ndarray:
    """A job's volume (Kokoro's volume_multiplier, fish's prosody.volume), clipped at full scale so a loud
    request saturates; every encoder then sees samples within [-1, 1]."""
    return audio if volume == 1.0 else np.clip(audio * np.float32(volume), -1.0, 1.0)


async def audio_bytes(stream: Stream, job: SpeechJob, tally: Tally | None = None) -> AsyncIterator[bytes]:
    """Encoded audio bytes as the engine produces them (one stream, one encoder)."""
    tally = tally if tally is not None else Tally()
    # the encoder is made inside _delivering: a worker process that cannot start still frees the engine slot
    with _delivering(stream, tally), contextlib.closing(encoder_for(job, stream.sample_rate)) as enc:
        async for chunk in stream:
            picked = time.perf_counter()
            data = await enc.encode(scaled(chunk.audio, job.volume))
            tally.audio(enc, data)
            if data:
                if tally.marks is not None:
                    chunk_trace.mark(tally.marks, _emitted(stream, chunk.index), picked)
                yield data
        tail = await enc.finish()
        tally.audio(enc, tail)
        if tail:
            yield tail


def _emitted(stream: Stream, index: int) -> float | None:
    arrivals = stream.arrivals  # (time, samples) per emitted chunk, in order
    return arrivals[index][0] if index < len(arrivals) else None


async def sse_events(stream: Stream, job: SpeechJob, tally: Tally | None = None) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: `speech.audio.delta` events with base64 audio, then `speech.audio.done`. An error
    before the first event is raised (nothing was sent: the adapter answers with its status); after it, an
    `error` event with the failure table's message and status ends the stream."""
    started = False
    try:
        async for data in audio_bytes(stream, job, tally):
            started = True
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        frames = stream.frames
        yield _event({"type": "speech.audio.done", "usage": {"input_characters": job.characters,
                                                             "output_frames": frames, "seed": stream.seed}})
    except Exception as e:
        if not started:
            raise
        f = failure(e)  # one safe line: never an internal message
        log.warning("stream failed: %s", e)
        yield _event({"type": "error", "error": {"message": f.message, "code": f.status}})


def audio_record(index: int, data: bytes, fmt: str, sample_rate: int) -> dict:
    """One self-describing piece of streamed audio, as the SageMaker and RunPod adapters send it."""
    return {"index": index, "audio": base64.b64encode(data).decode(), "format": fmt,
            "content_type": CONTENT_TYPES[fmt], "sample_rate": sample_rate}


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def generated(stream: Stream) -> SynthesisResult:
    """The stream's whole result (float32 audio, reports), awaited without a thread; its error if it failed."""
    parts = [chunk async for chunk in stream]
    return SynthesisResult.join(parts, stream.sample_rate, stream.seed, stream.plan.reports)


async def unless_left(waiting: asyncio.Future[T], gone: Callable[[], Awaitable[bool]] | None, why: str) -> T:
    """waiting's result, asking gone() every POLL seconds whether the client left; if it did, Abandoned(why) is
    raised and waiting left running: the caller gives its work up (unless_gone, service.Planning.submit)."""
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=POLL)
        if done:
            return waiting.result()
        if gone is not None and await gone():
            raise Abandoned(why)


async def unless_gone(work: Awaitable[T], stream: Stream, gone: Callable[[], Awaitable[bool]]) -> T:
    """Awaits `work` (a whole answer: generated(), whole()), asking gone() every POLL seconds whether the client
    left; if it did, the generation is cancelled and Abandoned raised (nobody would read the answer)."""
    task = asyncio.ensure_future(work)
    try:
        return await unless_left(task, gone, "the client closed the connection before its answer was ready")
    finally:
        if not task.done():
            stream.cancel()
            task.cancel()


async def whole(stream: Stream, job: SpeechJob, tally: Tally | None = None) -> EncodedAudio:
    """The complete utterance as one file (exact headers); the tally's first audio is the whole file's."""
    tally = tally if tally is not None else Tally()
    parts = []
    with _delivering(stream, tally), contextlib.closing(encoder_for(job, stream.sample_rate, streaming=False)) as enc:
        async for chunk in stream:
            parts.append(await enc.encode(scaled(chunk.audio, job.volume)))
            tally.audio_seconds = enc.seconds
        parts.append(await enc.finish())
        data = b"".join(parts)
        tally.audio(enc, data)
    return EncodedAudio(data, enc.content_type, enc.rate, enc.seconds)

