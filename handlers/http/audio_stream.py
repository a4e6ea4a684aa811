"""Streamed audio whose status is honest. The headers wait for the first piece of audio, so a request that fails
before any (no audio at all, an engine out of service, a shutdown while queued) gets its JSON error and status
instead of a 200 with an empty body. When the generation fails after the headers went out, the body stops
without HTTP's end-of-body marker, so a WAV or PCM client sees an incomplete transfer instead of a short file
that looks whole, and the log gets one warning instead of an "Exception in ASGI application" traceback.
"""

from __future__ import annotations

import logging

from starlette.responses import StreamingResponse
from starlette.types import Send

from ttsengine import TTSError
from ttsengine.serving.failure import failure

from .errors import failure_response

log = logging.getLogger("handlers.http")


class AudioStream(StreamingResponse):
    async def stream_response(self, send: Send) -> None:
        chunks = aiter(self.body_iterator)
        try:
            first = await anext(chunks, b"")
        except Exception as e:  # noqa: BLE001 - nothing was sent yet: the error as the response
            if not isinstance(e, TTSError):  # a bug: its traceback to the log, "internal server error" to the client
                log.exception("audio stream failed before its first audio")
            error = failure_response(failure(e))
            await send({"type": "http.response.start", "status": error.status_code, "headers": error.raw_headers})
            await send({"type": "http.response.body", "body": error.body, "more_body": False})
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except TTSError as e:
            # returning without the last message makes the server close the connection mid-body
            log.warning("audio stream cut short, the connection is closed without the end of the body: %s", e)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
