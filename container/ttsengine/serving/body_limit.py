"""The request body limit of the ASGI adapters (HTTP and SageMaker's `serve`): a body over the limit is
refused with 413 by its Content-Length before anything is read, or while a body of unknown length arrives.
Plain ASGI, so the core needs no web framework for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..errors import InputError


class BodyTooLarge(InputError):
    """The request body is over the server's limit (HTTP 413)."""

    status = 413


class BodyLimit:
    """ASGI middleware. reply(error) -> the JSON body of the 413 in the adapter's own error layout."""

    def __init__(self, app, limit: int, reply: Callable[[BodyTooLarge], dict]):
        self.app, self.limit, self.reply = app, limit, reply

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(send)
        seen, started = 0, False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self.error()  # an InputError: the adapter's error handling answers 413
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:  # nothing in the app turned it into a response
                await self._refuse(send)

    def error(self) -> BodyTooLarge:
        return BodyTooLarge(f"request body over {self.limit} bytes")

    async def _refuse(self, send) -> None:
        data = json.dumps(self.reply(self.error())).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
