"""Feature runpod_coalesce's reader (serving/coalesce.py): a consumer that keeps up gets each chunk as it comes, one
that fell behind gets what was made since in one piece, bounded; errors come after the bytes before them; a consumer
that leaves stops the reading and closes the source."""

from __future__ import annotations

import asyncio

import pytest

from ttsengine.serving.coalesce import HIGH_WATER, coalesced
from ttsengine.serving.switches import runpod_coalesce, runpod_pickup


class Source:
    """An async generator of chunks released one at a time by the test (release()), recording what happened."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None):
        self.chunks, self.fail = chunks, fail
        self.gate = asyncio.Semaphore(0)
        self.made, self.closed = 0, False

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    async def run(self):
        try:
            for chunk in self.chunks:
                await self.gate.acquire()
                self.made += 1
                yield chunk
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


async def settle() -> None:
    for _ in range(20):  # let the reading task take what was released
        await asyncio.sleep(0)


def test_a_consumer_that_keeps_up_gets_each_chunk_and_one_behind_gets_them_together():
    async def go():
        src = Source([b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10])
        pieces = coalesced(src.run(), limit=1000)
        src.release()
        first = await pieces.__anext__()  # the first chunk alone: first audio is not held back
        src.release(3)
        await settle()  # the consumer was busy (RunPod's SDK posting the first item) while three more came
        rest = [p async for p in pieces]
        return first, rest, src

    first, rest, src = asyncio.run(go())
    assert first == b"a" * 10
    assert rest == [b"b" * 10 + b"c" * 10 + b"d" * 10] and src.closed


def test_pieces_are_bounded_and_the_reading_waits_for_a_slow_consumer():
    async def go():
        src = Source([bytes([i]) * 40 for i in range(10)])
        pieces = coalesced(src.run(), limit=50)
        src.release(10)
        first = await pieces.__anext__()  # the reading starts with the consumer's first ask
        await settle()
        read_ahead = src.made  # then the consumer is busy: the reader stops at its high-water mark
        out = [first, *[p async for p in pieces]]
        return read_ahead, out

    read_ahead, out = asyncio.run(go())
    assert 1 < read_ahead <= 1 + HIGH_WATER * 50 // 40 + 1  # the first chunk, then up to the mark and one past it
    assert all(len(p) <= 50 for p in out) and b"".join(out) == b"".join(bytes([i]) * 40 for i in range(10))


def test_the_first_chunk_goes_alone_even_when_more_are_there():
    async def go():
        src = Source([b"a" * 10, b"b" * 10, b"c" * 10])
        src.release(3)  # all made before the consumer asks (an encoder that never waits)
        return [p async for p in coalesced(src.run(), limit=1000)]

    assert asyncio.run(go()) == [b"a" * 10, b"b" * 10 + b"c" * 10]


def test_an_error_comes_after_the_bytes_made_before_it():
    async def go():
        src = Source([b"x" * 5, b"y" * 5], fail=RuntimeError("the engine failed"))
        got = []
        src.release(2)
        with pytest.raises(RuntimeError, match="the engine failed"):
            async for p in coalesced(src.run(), limit=100):
                got.append(p)
        return got

    assert b"".join(asyncio.run(go())) == b"x" * 5 + b"y" * 5


def test_a_reading_cancelled_from_elsewhere_ends_with_an_error_the_job_can_report():
    # the source's own await cancelled (a resampler's future at shutdown): the consumer gets the bytes before it, then
    # a TTSError (an error item for the job), not a bare RuntimeError the SDK would send with its traceback
    from ttsengine.errors import TTSError

    async def cut():
        yield b"a" * 10
        raise asyncio.CancelledError

    async def go():
        got = []
        with pytest.raises(TTSError, match="the audio stopped before its end"):
            async for p in coalesced(cut(), limit=100):
                got.append(p)
        return got

    assert asyncio.run(go()) == [b"a" * 10]


def test_a_consumer_that_leaves_closes_the_source():
    async def go():
        src = Source([b"a"] * 5)
        pieces = coalesced(src.run(), limit=100)
        src.release()
        await pieces.__anext__()
        await pieces.aclose()  # RunPod stopped the job
        return src

    src = asyncio.run(go())
    assert src.closed and src.made == 1


def test_the_off_switches():
    assert runpod_coalesce("auto") and not runpod_coalesce("-runpod_coalesce") and not runpod_coalesce("none")
    assert runpod_pickup("auto") and not runpod_pickup("-runpod_pickup") and runpod_pickup("-runpod_coalesce")
