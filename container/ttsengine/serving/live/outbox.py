"""What a live socket has still to send, bounded: producers put messages without waiting for the client, one writer
hands them to the socket in order. A client that stops reading stalls the writer (the transport stops taking data
once its buffers are full); the messages then pile up here, and past `cap` bytes put() raises Overflow, so the
adapter can cancel the session's generation and close the socket instead of holding an engine slot and memory for a
client that is gone in all but name."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

Sent = Callable[[], None] | None  # called once the socket took the message (a metric's moment)


class Overflow(Exception):
    pass


class Outbox:
    def __init__(self, send: Callable[[object], Awaitable[None]], cap: int):
        self._send, self.cap = send, cap
        self._items: deque[tuple[object, int, Sent]] = deque()
        self._ready, self._empty = asyncio.Event(), asyncio.Event()
        self._empty.set()
        self.pending = 0  # bytes put and not yet taken by the socket
        self.sent_at: float | None = None  # loop time the socket last took a message

    def put(self, item: object, size: int, on_sent: Sent = None) -> None:
        if self.pending + size > self.cap and self.pending:
            raise Overflow(f"the client is not reading: over {self.cap} bytes wait to be sent")
        self._items.append((item, size, on_sent))
        self.pending += size
        self._ready.set()
        self._empty.clear()

    def drop(self) -> None:
        """Forget what waits (the socket is closing with an error)."""
        self._items.clear()
        self.pending = 0
        self._empty.set()

    async def drained(self) -> None:
        """Until the socket took everything put so far (callers bound the wait: a stalled client never drains)."""
        await self._empty.wait()

    async def run(self) -> None:
        """The writer: sends in order until cancelled; a send that raises ends it (the socket is gone)."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._items:
                self._ready.clear()
                await self._ready.wait()
            item, size, on_sent = self._items[0]
            await self._send(item)
            if on_sent is not None:
                on_sent()
            if self._items and self._items[0][0] is item:
                self._items.popleft()
                self.pending -= size
            if not self._items:
                self._empty.set()
            self.sent_at = loop.time()
