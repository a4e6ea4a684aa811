"""The request body limits of the ASGI adapters (HTTP and SageMaker's `serve`): a body over the size limit is
refused with 413 by its Content-Length before anything is read, or while a body of unknown length arrives. A
slow client must not hold a connection and a worker forever, and a pause limit alone does not stop one that
sends a few bytes a second, so a body gets 408 (and its connection is closed) when it pauses for `read_timeout`
seconds, when it averages under `min_rate` bytes/s once `rate_grace` seconds have passed, or when it is still
arriving after `body_timeout` seconds. Its clock starts when the app first asks for the body, so time the
server spends before reading it is not the client's. Plain ASGI, so the core needs no web framework for it.
The headers before a body, and connections with no request, are bounded below the app: connection_guard.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from ...errors import InputError


class BodyTooLarge(InputError):
    """The request body is over the server's limit (HTTP 413)."""

    status = 413


class BodyTimeout(InputError):
    """The client stopped sending its request body (HTTP 408)."""

    status = 408


class BodyLimit:
    """ASGI middleware. reply(error) -> the JSON body of the 413/408 in the adapter's own error layout. min_rate
    and body_timeout: 0 is no limit."""

    def __init__(self, app, limit: int, reply: Callable[[InputError], dict], read_timeout: float = 30.0,
                 min_rate: float = 0.0, rate_grace: float = 10.0, body_timeout: float = 0.0):
        self.app, self.limit, self.reply, self.read_timeout = app, limit, reply, read_timeout
        self.min_rate, self.rate_grace, self.body_timeout = min_rate, rate_grace, body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(send)
        seen, started, body_done, timed_out = 0, False, False, False
        loop = asyncio.get_running_loop()
        began: float | None = None  # when the app first asked for the body

        async def counted_receive():
            nonlocal seen, body_done, began, timed_out
            if body_done:  # after the body, receive() waits for a disconnect for as long as a stream lasts
                return await receive()
            began = loop.time() if began is None else began
            wait, why = self._deadline(loop.time() - began, seen)
            try:
                if wait <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), wait)
            except asyncio.TimeoutError:
                timed_out = True
                raise BodyTimeout(why(loop.time() - began, seen)) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > self.limit:
                    raise self.error()  # an InputError: the adapter's error handling answers 413
            else:
                body_done = True
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if timed_out:  # the rest of a slow body must not keep the connection: the server closes it
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except (BodyTooLarge, BodyTimeout) as e:
            if not started:  # nothing in the app turned it into a response
                await self._refuse(tracked_send, e)

    def _deadline(self, elapsed: float, seen: int) -> tuple[float, Callable[[float, int], str]]:
        """-> (seconds the next piece of body may take, why it is late if it takes longer: (elapsed, bytes seen)
        -> the 408's message), the nearest of the pause, rate and whole-body limits."""
        limits = [(self.read_timeout, lambda t, n: f"the request body stalled for {self.read_timeout:g} s")]
        if self.min_rate:  # `seen` bytes keep the average up until seen / min_rate seconds have passed
            limits.append((max(self.rate_grace, seen / self.min_rate) - elapsed,
                           lambda t, n: f"the request body arrived at {n / max(t, 1e-9):.0f} bytes/s, under "
                                        f"{self.min_rate:g} bytes/s"))
        if self.body_timeout:
            limits.append((self.body_timeout - elapsed,
                           lambda t, n: f"the request body took longer than {self.body_timeout:g} s"))
        return min(limits, key=lambda limit: limit[0])

    def error(self) -> BodyTooLarge:
        return BodyTooLarge(f"request body over {self.limit} bytes")

    async def _refuse(self, send, error: InputError | None = None) -> None:
        error = error or self.error()
        data = json.dumps(self.reply(error)).encode()
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
