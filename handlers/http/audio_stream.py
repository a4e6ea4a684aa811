"""Streamed audio that can end early: when the generation fails after the headers went out (an engine taken out
of service, a shutdown), the body stops without HTTP's end-of-body marker, so a WAV or PCM client sees an
incomplete transfer instead of a short file that looks whole, and the log gets one warning instead of an
"Exception in ASGI application" traceback.
"""

from __future__ import annotations

import logging

from starlette.responses import StreamingResponse
from starlette.types import Send

from ttsengine import TTSError

log = logging.getLogger("handlers.http")


class AudioStream(StreamingResponse):
    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except TTSError as e:
            # returning without the last message makes the server close the connection mid-body
            log.warning("audio stream cut short, the connection is closed without the end of the body: %s", e)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
