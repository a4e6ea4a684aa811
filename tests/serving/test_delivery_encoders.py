"""delivery.py's three doors (audio_bytes, sse_events, whole) over a real Stream fed as the engine feeds it,
with the encoder worker processes on and off: the bytes equal the in-process encoder's, pcm stays on the event
loop, and a worker killed mid-stream ends that stream as other errors end it (an SSE `error` event, 500)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest

from ttsengine.audio import encoder_pool
from ttsengine.audio.encode import AudioEncoder
from ttsengine.config import encoder_processes
from ttsengine.serving import delivery
from ttsengine.serving.failure import failure
from ttsengine.serving.protocol import SpeechJob
from ttsengine.synthesis.request import SynthesisRequest
from ttsengine.synthesis.stream import Stream

RATE = 44100


def engine_chunks() -> list[np.ndarray]:
    """[n] float32 chunks of 4, 4, 8, 8, 8 frames (2048 samples a frame)."""
    t = np.arange(32 * 2048) / RATE
    x = (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.split(x, np.cumsum([s * 2048 for s in (4, 4, 8, 8)]))


def fed_stream(parts: list[np.ndarray], end: bool = True) -> Stream:
    stream = Stream(SimpleNamespace(frames=len(parts) * 8, seed=7), RATE)  # the plan: what delivery reads
    for c in parts:
        stream.emit(c, 0)
    if end:
        stream.finish()
    return stream


def job(fmt: str, **kw) -> SpeechJob:
    return SpeechJob(SynthesisRequest(text="hi"), fmt, kw.get("sample_rate"), kw.get("speed", 1.0), True)


def reference(fmt: str, parts, streaming: bool = True) -> bytes:
    enc = AudioEncoder(fmt, RATE, streaming=streaming)
    return b"".join(enc.encode(c) for c in parts) + enc.finish()


async def collect(it) -> bytes:
    return b"".join([piece async for piece in it])


@pytest.fixture(params=[1, 0], ids=["processes", "threads"])
def processes(request):
    encoder_pool.start(request.param)
    yield request.param
    encoder_pool.close()


@pytest.mark.parametrize("fmt", ["mp3", "aac", "pcm", "wav"])
def test_audio_bytes_and_whole_equal_the_in_process_encoder(processes, fmt):
    parts = engine_chunks()
    tally = delivery.Tally()
    streamed = asyncio.run(collect(delivery.audio_bytes(fed_stream(parts), job(fmt), tally)))
    assert streamed == reference(fmt, parts) and tally.outcome == "ok"
    assert tally.audio_seconds == pytest.approx(sum(map(len, parts)) / RATE, abs=0.01)
    file = asyncio.run(delivery.whole(fed_stream(parts), job(fmt)))
    assert file.data == reference(fmt, parts, streaming=False)
    assert file.content_type == AudioEncoder(fmt, RATE).content_type
    where = delivery.encoder_for(job(fmt), RATE).where
    # pcm's default rate is 24 kHz (resampled: on the resampler threads, feature resample_thread, on by default); wav
    # stays at the native rate (inline); the compressed formats go to the pool, or a worker thread without it
    assert where == {"pcm": "resampler", "wav": "inline"}.get(fmt, "process" if processes else "thread")


def test_sse_events_through_the_pool(processes):
    parts = engine_chunks()
    events = asyncio.run(collect(delivery.sse_events(fed_stream(parts), job("mp3"))))
    payloads = [json.loads(e[6:]) for e in events.decode().strip().split("\n\n")]
    audio = b"".join(base64.b64decode(p["audio"]) for p in payloads if p["type"] == "speech.audio.delta")
    assert audio == reference("mp3", parts) and payloads[-1]["type"] == "speech.audio.done"


def test_a_killed_worker_ends_its_stream_with_an_error_event():
    parts = engine_chunks()
    encoder_pool.start(1)
    try:
        async def run():
            stream = fed_stream(parts[:2], end=False)
            events = delivery.sse_events(stream, job("opus"))
            first = await events.__anext__()  # one delta out: the stream has started
            pool = encoder_pool.shared(lambda: 1)
            os.kill(pool.workers()[0].pid, signal.SIGKILL)
            for c in parts[2:]:
                stream.emit(c, 0)
            stream.finish()
            rest = [e async for e in events]
            return first, rest

        first, rest = asyncio.run(run())
        last = json.loads(rest[-1][6:])
        assert json.loads(first[6:])["type"] == "speech.audio.delta"
        assert last["type"] == "error" and last["error"]["code"] == 500
        assert "audio encoder process" in last["error"]["message"]
        # the next stream gets a new worker
        again = asyncio.run(collect(delivery.audio_bytes(fed_stream(parts), job("mp3"))))
        assert again == reference("mp3", parts)
    finally:
        encoder_pool.close()


def test_the_setting():
    assert encoder_processes({"TTS_ENCODER_PROCESSES": "0"}) == 0
    assert encoder_processes({"TTS_ENCODER_PROCESSES": "3"}) == 3
    assert 0 <= encoder_processes({}) <= 8
    with pytest.raises(Exception, match="TTS_ENCODER_PROCESSES"):
        encoder_processes({"TTS_ENCODER_PROCESSES": "-1"})
    assert failure(encoder_pool.EncoderFailed("the mp3 encoder stopped")).status == 500
