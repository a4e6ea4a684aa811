"""The API key check of the HTTP server, as ASGI middleware: it runs before anything reads the request body, so
a caller without the key gets 401 for any body (an invalid JSON, a 20 MB upload) and the server spends nothing
on it. The key comes as `Authorization: Bearer <key>`, `X-API-Key: <key>` or `xi-api-key: <key>` (ElevenLabs'
clients). A credential header sent twice is a 400: which copy counts would be a guess (proxies and frameworks
disagree: first, last, or joined), and a guess is how a request smuggles a key past a proxy that checked the other.

Open without the key: the health and metrics probes (orchestrators call them without credentials), the web page
and its assets, the API's description (/docs, /openapi.json: they hold no data and the code is public), finished
audio behind a download link (/v1/download/NAME: the 128-bit random name is the credential, like a presigned
URL, so a browser's plain link works), and CORS preflights (browsers never send credentials on them). A WebSocket
handshake (/v1/tts/live) needs the key too.

With no key set, CrossSite refuses cross-site requests instead. A page on any site can make a visitor's browser
send a multipart form or a simple POST to this server without a CORS preflight: with no key, such a form could
replace or add a stored voice, or spend the GPU. Browsers say where a request comes from (`Origin`, and
`Sec-Fetch-Site`); a request that changes something (any method but GET, HEAD and OPTIONS) from an origin that is
neither this server's own nor one of TTS_CORS_ORIGINS is a 403 before its body is read. Clients that are not
browsers send neither header and are not affected; nor is this server's own web page. Behind a proxy that
rewrites `Host`, list the public origin in TTS_CORS_ORIGINS.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from urllib.parse import urlsplit

OPEN_PATHS = frozenset({"/", "/health", "/v1/health", "/ready", "/metrics", "/docs", "/docs/oauth2-redirect",
                        "/openapi.json", "/favicon.ico"})
OPEN_PREFIXES = ("/static/", "/docs/", "/v1/download/")
CREDENTIAL_HEADERS = (b"authorization", b"x-api-key", b"xi-api-key")


def repeated_credential(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The name of a credential header the request sends more than once, or None."""
    names = [name.lower() for name, _ in headers]
    return next((n.decode() for n in CREDENTIAL_HEADERS if names.count(n) > 1), None)


def key_matches(headers: dict[bytes, bytes], key: str) -> bool:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    token = auth[7:] if auth[:7].lower() == "bearer " else \
        (headers.get(b"x-api-key") or headers.get(b"xi-api-key", b"")).decode("latin-1")  # xi-: ElevenLabs' clients
    return hmac.compare_digest(token.encode(), key.encode())


class ApiKey:
    """ASGI middleware. reply(message, status) -> the JSON body of the 401 (or 400) in the adapter's own error
    layout."""

    def __init__(self, app, key: str | None, reply: Callable[[str], dict]):
        self.app, self.key, self.reply = app, key, reply

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or not self.key or self.is_open(scope):
            return await self.app(scope, receive, send)
        headers = list(scope.get("headers") or [])
        twice = repeated_credential(headers)
        if twice is not None:
            return await self.refuse(scope, receive, send, 400, f"the request has {twice} twice: send one")
        if key_matches(dict(headers), self.key):
            return await self.app(scope, receive, send)
        await self.refuse(scope, receive, send, 401, "missing or wrong API key (Authorization: Bearer <key>)")

    async def refuse(self, scope, receive, send, status: int, message: str) -> None:
        data = json.dumps(self.reply(message, status)).encode()
        headers = [(b"content-type", b"application/json")]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if scope["type"] == "websocket":
            return await self.refuse_websocket(scope, receive, send, status, headers, data, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def refuse_websocket(scope, receive, send, status: int, headers: list, data: bytes, message: str) -> None:
        """The handshake is answered with the status and the JSON body where the server can (ASGI's
        websocket.http.response extension), else refused (servers answer 403)."""
        await receive()  # websocket.connect
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": data})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})

    @staticmethod
    def is_open(scope) -> bool:
        path = scope.get("path", "")
        return scope.get("method") == "OPTIONS" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


# ---- no key: other sites' browser requests -----------------------------------------------------------------
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site_origin(headers: dict[bytes, bytes], allowed: tuple[str, ...]) -> str | None:
    """The foreign origin a browser says the request comes from; None when it is this server's own, allowed, or
    no browser's (no Origin, no Sec-Fetch-Site)."""
    origin = headers.get(b"origin", b"").decode("latin-1").strip()
    if not origin:
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").strip().lower()
        return "a cross-site page" if site == "cross-site" else None
    if "*" in allowed or origin in allowed:
        return None
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    if origin != "null" and host and urlsplit(origin).netloc.lower() == host:
        return None
    return origin


class CrossSite:
    """ASGI middleware. reply(message) -> the JSON body of the 403 in the adapter's own error layout."""

    def __init__(self, app, allowed: tuple[str, ...], reply: Callable[[str], dict]):
        self.app, self.allowed, self.reply = app, tuple(allowed), reply

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") in SAFE_METHODS:
            return await self.app(scope, receive, send)
        origin = cross_site_origin(dict(scope.get("headers") or []), self.allowed)
        if origin is None:
            return await self.app(scope, receive, send)
        data = json.dumps(self.reply(
            f"cross-site request refused: {origin[:100]!r} is not an allowed origin (no API key is set, so only "
            "this server's own pages and the origins in TTS_CORS_ORIGINS may send it)")).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
