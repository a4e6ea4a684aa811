"""Audio that was ready together goes out as one piece (feature runpod_coalesce).

RunPod's SDK posts each item a streamed job yields and waits for the answer before it asks for the next; per item it
also formats the item twice for its debug log and serialises it to JSON. At 8-frame chunks (18 kB of pcm at 24 kHz)
that per-item cost, more than the bytes, sets a worker's delivery (scripts/runpod_item_cost.py: the SDK's own job
code on a CPU sent 1.7x the audio per second in items four chunks long; docs/deploy-runpod.md, "One worker's
throughput").
`coalesced` reads a job's encoded audio on a task of its own; each time the consumer asks, it gets everything made
since its last piece: a consumer that keeps up gets each chunk as it comes (the first one alone: first audio is not
delayed), one that fell behind gets fewer, larger pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from .. import errors

HIGH_WATER = 2  # pieces of audio read ahead at most before the reading waits for the consumer (backpressure)


async def coalesced(source: AsyncGenerator[bytes, None], limit: int) -> AsyncIterator[bytes]:
    """The source's bytes in pieces of at most `limit`: the first chunk alone, then each piece all that was read since
    the last one (at least one of the source's chunks, or `limit` of it). An error of the source comes after the bytes
    read before it. Closing this generator (the consumer left, the job was stopped) stops the reading and closes the
    source, so whatever the source holds (an engine's stream slot) is freed at once."""
    buffer = bytearray()
    ready, room = asyncio.Event(), asyncio.Event()
    ended: list[BaseException | None] = []  # [None] at the source's end, [error] when it failed

    async def read() -> None:
        try:
            async with contextlib.aclosing(source) as chunks:
                first = True
                async for data in chunks:
                    buffer.extend(data)
                    ready.set()
                    # the first chunk goes out alone (first audio), even when the next ones are there already
                    while buffer and (first or len(buffer) >= HIGH_WATER * limit):
                        room.clear()
                        await room.wait()
                    first = False
            ended.append(None)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, after the bytes before it
            ended.append(e)
        finally:
            ready.set()

    reader = asyncio.create_task(read())
    try:
        while True:
            if not buffer:
                if ended or reader.done():
                    break
                ready.clear()  # nothing runs between the checks above and this: no wake-up is lost
                await ready.wait()
                continue
            piece = bytes(buffer[:limit])
            del buffer[:limit]
            room.set()
            yield piece
        if not ended:  # the reading itself was cancelled from elsewhere (a resampler's future at shutdown): the
            # job ends with an error item that says so, not a stack trace
            raise errors.CancelledError("the audio stopped before its end")
        if ended[0] is not None:
            raise ended[0]
    finally:
        reader.cancel()
        await asyncio.wait({reader})  # a cancel of this task meanwhile still propagates (no suppress)
