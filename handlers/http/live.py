"""Fish Audio's live protocol: WebSocket `/v1/tts/live`, the endpoint fish-audio-sdk's `stream_websocket` and
livekit-plugins-fishaudio speak (the protocol: ttsengine/serving/live/fish_socket.py). The `model` header
fish-audio-sdk sends is accepted and ignored (one model is served); the API key is checked as for HTTP
(serving/network/api_key.py), and a browser page's Origin as CORS would (origin_allowed).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketState

from ttsengine.serving.live.fish_socket import FishConnection

router = APIRouter()


@router.websocket("/v1/tts/live")
async def live(ws: WebSocket):
    if not origin_allowed(ws.headers, ws.app.state.server.cors_origins):
        await ws.close(1008, "origin not allowed (TTS_CORS_ORIGINS)")  # before accept: the handshake gets a 403
        return
    await ws.accept()
    state = ws.app.state
    await FishConnection(ws, lambda: ws.application_state == WebSocketState.DISCONNECTED, state.service,
                         state.server, state.metrics.live).run()


def origin_allowed(headers, allowed: tuple[str, ...]) -> bool:
    """Browsers send an Origin with every WebSocket handshake and, unlike fetch, need no CORS answer to connect,
    so any web page could use a server without a key: a page on another origin is let in only when
    TTS_CORS_ORIGINS names it (or is *), as for HTTP. SDKs send no Origin; this server's own page is same-origin."""
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    return origin.partition("://")[2] == headers.get("host", "")
