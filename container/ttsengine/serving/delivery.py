"""From an engine Stream to bytes on the wire, for any transport: encoded audio as it is produced,
OpenAI-style SSE events, or one whole file. Encoding runs in a worker thread so the event loop keeps
serving other streams; leaving an iterator early (a client that went away) cancels the generation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator

import numpy as np

from ..audio.encode import CONTENT_TYPES, AudioEncoder, EncodedAudio
from ..synthesis.stream import Stream
from .protocol import SpeechJob

log = logging.getLogger(__name__)


def encoder_for(job: SpeechJob, native_rate: int, streaming: bool = True) -> AudioEncoder:
    return AudioEncoder(job.format, native_rate, job.sample_rate, job.speed, streaming=streaming)


def scaled(audio: np.ndarray, volume: float) -> np.ndarray:
    """A job's volume (Kokoro's volume_multiplier, fish's prosody.volume), clipped at full scale so a loud
    request saturates; every encoder then sees samples within [-1, 1]."""
    return audio if volume == 1.0 else np.clip(audio * np.float32(volume), -1.0, 1.0)


async def audio_bytes(stream: Stream, job: SpeechJob) -> AsyncIterator[bytes]:
    """Encoded audio bytes as the engine produces them (one stream, one encoder)."""
    enc = encoder_for(job, stream.sample_rate)
    try:
        async for chunk in stream:
            data = await asyncio.to_thread(enc.encode, scaled(chunk.audio, job.volume))
            if data:
                yield data
        tail = await asyncio.to_thread(enc.finish)
        if tail:
            yield tail
    finally:
        if not stream.done:
            stream.cancel()  # the consumer stopped early: free the engine slot


async def sse_events(stream: Stream, job: SpeechJob) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: `speech.audio.delta` events with base64 audio, then `speech.audio.done`."""
    try:
        async for data in audio_bytes(stream, job):
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        frames = sum(r.frames for r in stream.reports)
        yield _event({"type": "speech.audio.done", "usage": {"input_characters": job.characters,
                                                             "output_frames": frames, "seed": stream.seed}})
    except Exception as e:  # noqa: BLE001 - headers are gone: report in-band
        log.warning("stream failed: %s", e)
        yield _event({"type": "error", "error": {"message": str(e)}})


def audio_record(index: int, data: bytes, fmt: str, sample_rate: int) -> dict:
    """One self-describing piece of streamed audio, as the SageMaker and RunPod adapters send it."""
    return {"index": index, "audio": base64.b64encode(data).decode(), "format": fmt,
            "content_type": CONTENT_TYPES[fmt], "sample_rate": sample_rate}


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def whole(stream: Stream, job: SpeechJob) -> EncodedAudio:
    """The complete utterance as one file (exact headers)."""
    enc = encoder_for(job, stream.sample_rate, streaming=False)
    parts = []
    try:
        async for chunk in stream:
            parts.append(await asyncio.to_thread(enc.encode, scaled(chunk.audio, job.volume)))
        parts.append(await asyncio.to_thread(enc.finish))
    finally:
        if not stream.done:
            stream.cancel()
    return EncodedAudio(b"".join(parts), enc.content_type, enc.rate, enc.seconds)

