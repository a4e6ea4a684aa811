"""How late the server's event loop runs: a timer due every INTERVAL s notes how long after its time it woke.
Every socket's bytes and every live message are handled on that one loop, so its lag is added to each of them;
the client-side latency a server's own timers cannot see (a message read late, a send queued behind others)
shows here. The HTTP adapter keeps it as tts_event_loop_lag_seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

INTERVAL = 0.1  # s between wake-ups: ten tiny tasks a second, cheap next to any load


async def watch(observe: Callable[[float], None], interval: float = INTERVAL) -> None:
    """observe(seconds late) after each wake-up, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        observe(max(0.0, loop.time() - due))
