"""The API key check of the HTTP server, as ASGI middleware: it runs before anything reads the request body, so
a caller without the key gets 401 for any body (an invalid JSON, a 20 MB upload) and the server spends nothing
on it. The key comes as `Authorization: Bearer <key>`, `X-API-Key: <key>` or `xi-api-key: <key>` (ElevenLabs'
clients).

Open without the key: the health and metrics probes (orchestrators call them without credentials), the web page
and its assets, the API's description (/docs, /openapi.json: they hold no data and the code is public), finished
audio behind a download link (/v1/download/NAME: the 128-bit random name is the credential, like a presigned
URL, so a browser's plain link works), and CORS preflights (browsers never send credentials on them). A WebSocket
handshake (/v1/tts/live) needs the key too.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

OPEN_PATHS = frozenset({"/", "/health", "/v1/health", "/ready", "/metrics", "/docs", "/docs/oauth2-redirect",
                        "/openapi.json", "/favicon.ico"})
OPEN_PREFIXES = ("/static/", "/docs/", "/v1/download/")


def key_matches(headers: dict[bytes, bytes], key: str) -> bool:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    token = auth[7:] if auth[:7].lower() == "bearer " else \
        (headers.get(b"x-api-key") or headers.get(b"xi-api-key", b"")).decode("latin-1")  # xi-: ElevenLabs' clients
    return hmac.compare_digest(token.encode(), key.encode())


class ApiKey:
    """ASGI middleware. reply(message) -> the JSON body of the 401 in the adapter's own error layout."""

    def __init__(self, app, key: str | None, reply: Callable[[str], dict]):
        self.app, self.key, self.reply = app, key, reply

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or not self.key or self.is_open(scope):
            return await self.app(scope, receive, send)
        if key_matches(dict(scope.get("headers") or []), self.key):
            return await self.app(scope, receive, send)
        data = json.dumps(self.reply("missing or wrong API key (Authorization: Bearer <key>)")).encode()
        if scope["type"] == "websocket":
            return await self.refuse_websocket(scope, receive, send, data)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def refuse_websocket(scope, receive, send, data: bytes) -> None:
        """The handshake is answered 401 with the JSON body where the server can (ASGI's websocket.http.response
        extension), else refused (servers answer 403)."""
        await receive()  # websocket.connect
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "websocket.http.response.body", "body": data})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})

    @staticmethod
    def is_open(scope) -> bool:
        path = scope.get("path", "")
        return scope.get("method") == "OPTIONS" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
