"""The event loop's lag watcher on a real asyncio loop: a loop blocked by synchronous work shows as a late wake-up
of about the block's length; cancelling stops it."""

from __future__ import annotations

import asyncio
import time

from ttsengine.serving.network import loop_lag


def test_a_blocked_loop_shows_as_lag():
    lags: list[float] = []

    async def main():
        task = asyncio.create_task(loop_lag.watch(lags.append, interval=0.05))
        while len(lags) < 2:  # the watcher runs
            await asyncio.sleep(0.01)
        time.sleep(0.4)  # synchronous work on the loop: every socket would wait this long
        seen = len(lags)
        while len(lags) < seen + 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert min(lags) >= 0.0
    assert max(lags) >= 0.3, lags  # the block, less at most one interval of the timer's wait
    assert sorted(lags)[len(lags) // 2] < 0.3, lags  # the other wake-ups were not that late
