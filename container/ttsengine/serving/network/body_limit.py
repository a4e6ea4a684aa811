"""The request body limits of the ASGI adapters (HTTP and SageMaker's `serve`): a body over the size limit is
refused with 413 by its Content-Length before anything is read, or while a body of unknown length arrives; a
client that stops sending its body for `read_timeout` seconds gets 408 (a slow client must not hold a
connection and a worker forever). Plain ASGI, so the core needs no web framework for it.
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
    """ASGI middleware. reply(error) -> the JSON body of the 413/408 in the adapter's own error layout."""

    def __init__(self, app, limit: int, reply: Callable[[InputError], dict], read_timeout: float = 30.0):
        self.app, self.limit, self.reply, self.read_timeout = app, limit, reply, read_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(send)
        seen, started, body_done = 0, False, False

        async def counted_receive():
            nonlocal seen, body_done
            if body_done:  # after the body, receive() waits for a disconnect for as long as a stream lasts
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout)
            except asyncio.TimeoutError:
                raise BodyTimeout(f"the request body stalled for {self.read_timeout:g} s") from None
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
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except (BodyTooLarge, BodyTimeout) as e:
            if not started:  # nothing in the app turned it into a response
                await self._refuse(send, e)

    def error(self) -> BodyTooLarge:
        return BodyTooLarge(f"request body over {self.limit} bytes")

    async def _refuse(self, send, error: InputError | None = None) -> None:
        error = error or self.error()
        data = json.dumps(self.reply(error)).encode()
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
