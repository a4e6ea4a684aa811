"""Errors as JSON: `{"error": {"message", "type", "code"}}` with OpenAI's type words. Statuses and retry times
come from the shared table (ttsengine.serving.failure); HTTP-only refusals (auth, conflicts) are ApiError."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ttsengine import TTSError
from ttsengine.serving.failure import Failure, failure

log = logging.getLogger("handlers.http")
TYPES = {"input": "invalid_request_error", "busy": "server_busy", "server": "server_error"}


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


def add_error_handlers(app: FastAPI) -> None:
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
        kind = getattr(e, "kind", "invalid_request_error" if e.status_code < 500 else "server_error")
        return JSONResponse(error_body(str(e.detail), kind, e.status_code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return failure_response(failure(e))
