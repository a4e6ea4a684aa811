"""What the network adapters check before they start listening, and the HEAD-as-GET middleware they share."""

from __future__ import annotations

import errno
import socket


def port_problem(host: str, port: int) -> str | None:
    """None when (host, port) can be bound now; else one line saying why not (a port in use would otherwise
    end uvicorn's start-up in an abort after the model began loading)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no problem
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (set TTS_PORT or --port)"
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


class HeadAsGet:
    """ASGI middleware: a HEAD request runs its GET route and gets that response's status and headers (content
    length included) without the body, as HTTP asks; routes without GET still answer 405."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message):
            if message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app(dict(scope, method="GET"), receive, headers_only)
