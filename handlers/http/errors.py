"""Errors as JSON: `{"error": {"message", "type", "code"}}` with OpenAI's type words. Statuses and retry times
come from the shared table (ttsengine.serving.failure); HTTP-only refusals (auth, conflicts) are ApiError."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ttsengine import TTSError
from ttsengine.serving.failure import Failure, failure
from ttsengine.serving.network.api_key import SAFE_METHODS, ApiKey

log = logging.getLogger("handlers.http")
TYPES = {"input": "invalid_request_error", "busy": "server_busy", "server": "server_error"}
# nginx's "client closed request": the client hung up before its body was read whole. Nobody receives it; the
# metrics count it (code="499"), apart from the server's errors, and the log says so in one line.
CLIENT_CLOSED = 499


class ApiError(HTTPException):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(status, message, headers)
        self.kind = kind


def error_body(message: str, kind: str, status: int) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def failure_response(f: Failure) -> JSONResponse:
    kind = "too_large" if f.status == 413 else TYPES[f.kind]
    headers = {"Retry-After": str(f.retry_after)} if f.retry_after else None
    return JSONResponse(error_body(f.message, kind, f.status), status_code=f.status, headers=headers)


def client_closed(request: Request) -> Response:
    log.info("%s %s: the client closed the connection before its body was read", request.method, request.url.path)
    return Response(status_code=CLIENT_CLOSED)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect):
        return client_closed(request)

    @app.exception_handler(TTSError)
    async def _tts_error(request: Request, e: TTSError):
        f = failure(e)
        if f.status == 500:  # ours to fix (a failed load was logged once, when it happened)
            log.error("request failed: %s", e)
        return failure_response(f)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        if err.get("type") == "json_invalid":
            message = f"body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})"
        else:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            message = f"{where}: {err.get('msg', 'invalid request')}"
        return JSONResponse(error_body(message, "invalid_request_error", 400), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        if isinstance(e.__cause__, ClientDisconnect):  # FastAPI's form parsing: "error parsing the body" (400)
            return client_closed(request)
        if isinstance(e.__cause__, TTSError):  # the same, around the body limit's 413 (a chunked body) or 408
            return failure_response(failure(e.__cause__))
        kind = getattr(e, "kind", "invalid_request_error" if e.status_code < 500 else "server_error")
        return JSONResponse(error_body(str(e.detail), kind, e.status_code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return failure_response(failure(e))


# ---- the errors in /openapi.json ----------------------------------------------------------------------------
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"], "properties": {
        "message": {"type": "string", "description": "one line that says what is wrong and where"},
        "type": {"type": "string", "description": "invalid_request_error | authentication_error | "
                                                  "permission_error | too_large | server_busy | server_error"},
        "code": {"type": "integer", "description": "the HTTP status"}}}}}
MEANING = {
    400: "invalid request: the message names the field and why",
    401: "missing or wrong API key (Authorization: Bearer KEY, or X-API-Key: KEY)",
    403: "a browser request from another site (Origin not this server's nor in TTS_CORS_ORIGINS) while no API "
         "key is set",
    404: "not found",
    500: "failed: no engine can serve (health)",
    408: "the request headers or body came too slowly (TTS_HEADER_TIMEOUT, TTS_READ_TIMEOUT, TTS_BODY_MIN_RATE, "
         "TTS_BODY_TIMEOUT)",
    409: "the voice id is taken",
    413: "the body or the uploaded audio is over the limit",
    415: "wrong or missing content type (application/json or application/msgpack)",
    422: "the model produced no audio for this text (it ended at once)",
    503: "loading, full or shutting down: retry after Retry-After seconds",
}
SPEECH = (422, 503)
# the statuses a route answers with besides 200, 400 (parameters or a body), 408/413/415 (a body) and 404 (a
# name in the path); a route not listed here: 503 while loading, full or draining
ROUTE_CODES = {
    "/health": (500,), "/v1/health": (500,), "/metrics": (), "/ready": (503,),
    "/v1/audio/speech": SPEECH, "/v1/tts": SPEECH, "/v1/audio/speech/captioned": SPEECH,
    "/v1/references/add": (409, 503), "/v1/references/update": (404, 409, 503), "/v1/references/delete": (404, 503),
    "/v1/models": (), "/v1/models/{model_id}": (), "/v1/audio/voices": (), "/v1/download/{name}": (),
}


def document_errors(schema: dict, keyed: bool = False) -> None:
    """FastAPI documents a 422 "validation error" on every route with parameters; this server answers those
    with a 400 in its own error shape (422 means no audio). Each operation lists the statuses it answers with
    and the error body, so a generated client knows them. keyed: TTS_API_KEY is set (a 401 on the routes it
    guards)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    components["Error"] = ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = set(ROUTE_CODES.get(path, (503,)))
            if "requestBody" in op or any(p.get("in") == "query" for p in op.get("parameters", ())):
                codes.add(400)
            if "requestBody" in op:
                codes |= {408, 413, 415}  # the multipart routes answer JSON with a 415 too
            if "{" in path:
                codes.add(404)
            if keyed and not ApiKey.is_open({"path": path, "method": method.upper()}):
                codes.add(401)
            if not keyed and method.upper() not in SAFE_METHODS:
                codes.add(403)
            for code in sorted(codes):
                responses.setdefault(str(code), {"description": MEANING[code], "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
