"""The encoder worker processes (audio/encoder_pool.py) against the in-process AudioEncoder, real codecs both
sides: the same bytes for every format over a multi-chunk stream, streams that do not mix, a killed worker that
fails its own streams only (and is replaced for new ones), and workers that die with the process that made them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ttsengine import TTSError
from ttsengine.audio import encoder_pool
from ttsengine.audio.encode import AudioEncoder
from ttsengine.audio.encoder_pool import EncoderPool
from ttsengine.audio.encoder_process import EncoderFailed
from ttsengine.audio.stream_encoder import StreamEncoder

RATE = 44100
SIZES = (4, 4, 8, 8, 8, 8, 3)  # frames per chunk, as the engine grows them (2048 samples a frame)


def chunks(seed: int) -> list[np.ndarray]:
    """A voiced-ish signal, different for every seed: [n] float32 chunks."""
    rng = np.random.default_rng(seed)
    n = sum(SIZES) * 2048
    t = np.arange(n) / RATE
    x = (0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) + 0.01 * rng.standard_normal(n)).astype(np.float32)
    return np.split(x, np.cumsum([s * 2048 for s in SIZES])[:-1])


def reference(fmt: str, parts: list[np.ndarray], **kw) -> tuple[bytes, float]:
    enc = AudioEncoder(fmt, RATE, **kw)
    data = b"".join(enc.encode(c) for c in parts) + enc.finish()
    return data, enc.seconds


async def pooled(enc, parts: list[np.ndarray]) -> bytes:
    out = []
    for c in parts:
        out.append(await enc.encode(c))
        await asyncio.sleep(0)  # let other streams' requests interleave with this one's
    return b"".join(out) + await enc.finish()


def ogg_normalised(data: bytes) -> bytes:
    """Ogg pages with serial number and CRC zeroed: libavformat draws a random serial per stream (so two
    in-process runs differ too); everything else must be equal."""
    out, at = bytearray(data), 0
    while at < len(out):
        assert out[at:at + 4] == b"OggS"
        segments = out[at + 26]
        size = 27 + segments + sum(out[at + 27:at + 27 + segments])
        out[at + 14:at + 18] = out[at + 22:at + 26] = b"\0\0\0\0"
        at += size
    return bytes(out)


def same(fmt: str, a: bytes, b: bytes) -> bool:
    return ogg_normalised(a) == ogg_normalised(b) if fmt == "opus" else a == b


@pytest.fixture
def pool():
    p = EncoderPool(2)
    yield p
    p.close()


CASES = [("mp3", {}), ("opus", {}), ("aac", {}), ("flac", {}), ("mp3", {"sample_rate": 24000}),
         ("opus", {"speed": 1.3}), ("wav", {"speed": 0.8, "streaming": False}), ("pcm", {"speed": 1.25})]


@pytest.mark.parametrize("fmt, kw", CASES)
def test_pool_bytes_equal_in_process_bytes(pool, fmt, kw):
    parts = chunks(1)
    want, seconds = reference(fmt, parts, **kw)

    async def run():
        enc = pool.open(fmt, RATE, **kw)
        return await pooled(enc, parts), enc

    got, enc = asyncio.run(run())
    assert len(want) > 1000 and same(fmt, got, want)
    assert enc.seconds == seconds and enc.rate == AudioEncoder(fmt, RATE, **kw).rate


def test_concurrent_streams_do_not_mix(pool):
    formats = ["mp3", "opus", "aac", "mp3", "opus", "aac", "flac", "mp3"]
    signals = [chunks(i) for i in range(len(formats))]

    async def run():
        encs = [pool.open(fmt, RATE) for fmt in formats]
        assert {w.streams for w in pool.workers()} == {len(formats) // 2}  # spread over both workers
        return await asyncio.gather(*(pooled(e, s) for e, s in zip(encs, signals)))

    got = asyncio.run(run())
    for fmt, parts, data in zip(formats, signals, got):
        assert same(fmt, data, reference(fmt, parts)[0])
    assert all(w.streams == 0 for w in pool.workers())


def test_a_killed_worker_fails_its_streams_only_and_is_replaced(pool):
    parts = chunks(2)

    async def run():
        a, b = pool.open("mp3", RATE), pool.open("mp3", RATE)
        assert a._worker is not b._worker
        await a.encode(parts[0])
        first_b = await b.encode(parts[0])
        victim = a._worker
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(EncoderFailed, match=rf"audio encoder process .*pid {victim.pid}.* exited"):
            await a.encode(parts[1])
        with pytest.raises(EncoderFailed):  # its state is gone: the stream stays failed
            await a.finish()
        rest = b"".join([await b.encode(c) for c in parts[1:]]) + await b.finish()  # the other worker's stream
        c = pool.open("opus", RATE)  # a new stream: the dead worker's place has a new process
        assert c._worker is not victim and victim.failure is not None
        return first_b + rest, await pooled(c, parts)

    b_data, c_data = asyncio.run(run())
    assert b_data == reference("mp3", parts)[0]
    assert same("opus", c_data, reference("opus", parts)[0])
    assert pool.started == 3 and issubclass(EncoderFailed, TTSError)


def test_an_abandoned_stream_is_dropped_and_a_worker_error_is_clear(pool):
    async def run():
        enc = pool.open("mp3", RATE)
        await enc.encode(chunks(0)[0])
        enc.close()  # the client left: the worker forgets the stream
        assert sum(w.streams for w in pool.workers()) == 0
        with pytest.raises(EncoderFailed, match="already finished"):
            await enc.encode(chunks(0)[1])
        bad = pool.open("mp3", RATE)
        return await bad._worker.call(2, 999_999, b"")  # ENCODE on a stream the worker never opened

    with pytest.raises(EncoderFailed, match="not opened"):
        asyncio.run(run())


def test_stream_encoder_routes_by_format_and_the_off_switch():
    try:
        encoder_pool.start(1)
        assert StreamEncoder("pcm", RATE, pool=lambda: encoder_pool.shared(lambda: 1)).where == "inline"
        assert StreamEncoder("wav", RATE, 16000, pool=encoder_pool.shared(lambda: 1)).where == "inline"
        assert StreamEncoder("wav", RATE, speed=1.5, pool=encoder_pool.shared(lambda: 1)).where == "process"
        assert StreamEncoder("mp3", RATE, pool=encoder_pool.shared(lambda: 1)).where == "process"
        encoder_pool.start(0)  # off: every format as before the pool, in threads
        assert encoder_pool.shared(lambda: 4) is None
        enc = StreamEncoder("mp3", RATE, pool=lambda: encoder_pool.shared(lambda: 4))
        assert enc.where == "thread"
        parts = chunks(3)
        assert asyncio.run(pooled(enc, parts)) == reference("mp3", parts)[0]
    finally:
        encoder_pool.close()


WORKER_OWNER = """
import sys, time
from ttsengine.audio import encoder_pool
pool = encoder_pool.start(2)
print(" ".join(str(w.pid) for w in pool.workers()), flush=True)
time.sleep(600)
"""


def test_workers_die_with_the_process_that_started_them():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    owner = subprocess.Popen([sys.executable, "-c", WORKER_OWNER], stdout=subprocess.PIPE, text=True, env=env)
    pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(pids) == 2
    owner.kill()  # SIGKILL: no atexit, no close(); the workers see their input pipe close
    owner.wait()
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (the workers' parent is gone: init reaps them)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
