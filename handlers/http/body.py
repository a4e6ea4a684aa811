"""Request bodies by content type: the JSON routes read JSON or msgpack and answer 415 for anything else, a
missing content type included (`curl -d '{...}'` sends form data: the JSON inside would otherwise meet a
confusing 400). That also keeps other sites' pages out: a cross-origin form can only send form data or text
(415 here), and sending JSON needs a CORS preflight, which only TTS_CORS_ORIGINS allows.
"""

from __future__ import annotations

from fastapi import Request

from ttsengine import MediaTypeError
from ttsengine.serving.protocol import parse_body

JSON_TYPES = ("application/json", "text/json", "application/msgpack", "application/x-msgpack",
              "application/vnd.msgpack")
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
HINT = "send JSON with Content-Type: application/json (curl: -H 'content-type: application/json')"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def check_media_type(request: Request, allowed: tuple[str, ...], hint: str = HINT) -> None:
    ctype = media_type(request)
    if not ctype:
        raise MediaTypeError(f"the request has no Content-Type: {hint}")
    if ctype not in allowed:
        raise MediaTypeError(f"unsupported content type {ctype!r}: {hint}")


async def json_body(request: Request) -> dict:
    """The body as a dict, from JSON or msgpack; MediaTypeError (415) for any other content type or none."""
    check_media_type(request, JSON_TYPES)
    return parse_body(await request.body(), media_type(request))


async def optional_json_body(request: Request) -> dict | None:
    """As json_body where a body is optional (DELETE with a query parameter instead): None when empty."""
    raw = await request.body()
    if not raw:
        return None
    check_media_type(request, JSON_TYPES)
    return parse_body(raw, media_type(request))


async def form_only(request: Request) -> None:  # async: on the event loop, not the shared pool
    """A dependency for the multipart routes: JSON sent to them is a 415, not a list of missing fields."""
    check_media_type(request, FORM_TYPES, "send multipart/form-data (curl: -F id=... -F audio=@file)")
