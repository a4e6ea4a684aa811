"""The HTTP API: OpenAI `/v1/audio/speech`, fish-speech `/v1/tts`, voices, health/ready/metrics, the
web page. The model loads in the background: /health answers at once, /ready says 503 until the
engine is warm. Every error is JSON with a message; nothing returns a stack trace.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ttsengine import (
    CONTENT_TYPES,
    BusyError,
    Engine,
    EngineConfig,
    InputError,
    ServerConfig,
    TTSError,
    VoiceStore,
    audio_bytes,
    check_id,
    sse_events,
    whole,
)
from ttsengine.serving.protocol import FishTTSRequest, OpenAISpeechRequest, SpeechJob, fish_job, openai_job, parse_body

from .metrics import RequestCounter, render

log = logging.getLogger("handlers.http")
STATIC = Path(__file__).parent / "static"


class ApiError(HTTPException):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(status, message, headers)
        self.kind = kind


def error_body(message: str, kind: str, status: int) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


class EngineHolder:
    """Loads the engine on a background thread so the server answers /health and /ready meanwhile."""

    def __init__(self, factory: Callable[[], Engine], data_dir: Path):
        self.factory, self.data_dir = factory, data_dir
        self.engine: Engine | None = None
        self.voices: VoiceStore | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._load, name="engine-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _load(self) -> None:
        try:
            engine = self.factory()
            self.voices = VoiceStore(self.data_dir / "voices", engine.voice_codes, engine.codec_tag,
                                     engine.frame_rate)
            self.engine = engine
        except Exception as e:  # noqa: BLE001 - reported by /ready and /health
            log.exception("the engine failed to load")
            self.error = f"{type(e).__name__}: {e}"

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready.is_set()

    def require(self) -> Engine:
        if self.error:
            raise ApiError(503, f"the model failed to load: {self.error}", "server_error")
        if not self.ready:
            raise ApiError(503, "the model is loading; retry shortly (see GET /ready)", "server_busy",
                           {"Retry-After": "5"})
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_json(send, 413, error_body(f"request body over {self.limit} bytes", "too_large", 413))
        seen, started = 0, False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, error_body(f"request body over {self.limit} bytes", "too_large", 413))


class _TooLarge(Exception):
    pass


class CountRequests:
    """Counts responses by method, route template and status for /metrics."""

    def __init__(self, app, counter: RequestCounter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                route = scope.get("route")
                self.counter.add(scope["method"], getattr(route, "path", "unmatched"), message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def create_app(server: ServerConfig, engine_config: EngineConfig,
               engine_factory: Callable[[], Engine] | None = None) -> FastAPI:
    factory = engine_factory or (lambda: Engine.load(engine_config))
    holder = EngineHolder(factory, server.data_dir)
    counter = RequestCounter()

    async def lifespan(app: FastAPI):
        holder.start()
        yield
        await run_in_threadpool(holder.close)

    app = FastAPI(title="fish-tts-server", version="0.1.0", lifespan=lifespan,
                  description="Fish-Speech / OpenAudio S1-mini text to speech.")
    app.state.holder = holder
    app.add_middleware(CountRequests, counter=counter)
    app.add_middleware(BodyLimit, limit=server.max_body_bytes)

    def check_key(request: Request) -> None:
        if not server.api_key:
            return
        auth = request.headers.get("authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.encode(), server.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error",
                           {"WWW-Authenticate": "Bearer"})

    auth = [Depends(check_key)]

    # ---- errors -------------------------------------------------------------------------------
    @app.exception_handler(InputError)
    async def _input_error(request: Request, e: InputError):
        status = e.status
        return JSONResponse(error_body(str(e), "invalid_request_error", status), status_code=status)

    @app.exception_handler(BusyError)
    async def _busy(request: Request, e: BusyError):
        return JSONResponse(error_body(str(e), "server_busy", 503), status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(TTSError)
    async def _tts_error(request: Request, e: TTSError):
        log.error("request failed: %s", e)
        return JSONResponse(error_body(str(e), "server_error", 500), status_code=500)

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
        return JSONResponse(error_body("internal server error", "server_error", 500), status_code=500)

    # ---- health -------------------------------------------------------------------------------
    @app.get("/health", tags=["health"])
    async def health():
        if holder.error:
            return JSONResponse({"status": "failed", "error": holder.error}, status_code=500)
        return {"status": "ok"}

    @app.get("/ready", tags=["health"])
    async def ready():
        if holder.error:
            return JSONResponse({"status": "failed", "error": holder.error}, status_code=503)
        if not holder.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        stats = holder.engine.stats()
        return {"status": "ready", "warmup_seconds": stats["warmup_seconds"], "quantization": stats["quantization"],
                "kernel_cache": stats["kernel_cache"]}

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics():
        stats = holder.engine.stats() if holder.engine is not None else None
        return PlainTextResponse(render(counter, stats, holder.ready), media_type="text/plain; version=0.0.4")

    @app.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    # ---- speech -------------------------------------------------------------------------------
    async def submit(job: SpeechJob):
        engine = holder.require()
        return await run_in_threadpool(engine.submit, job.request)

    def audio_headers(job: SpeechJob, stream) -> dict:
        return {"X-Seed": str(stream.seed), "X-Sample-Rate": str(job.sample_rate or ""), "Cache-Control": "no-store"}

    @app.post("/v1/audio/speech", dependencies=auth, tags=["speech"],
              responses={200: {"content": {"audio/mpeg": {}, "text/event-stream": {}}}})
    async def speech(body: OpenAISpeechRequest):
        """OpenAI-compatible speech; the audio streams as it is generated (chunked transfer or SSE)."""
        holder.require()
        job = openai_job(body.model_dump(), holder.voices)
        stream = await submit(job)
        if job.sse:
            return StreamingResponse(sse_events(stream, job), media_type="text/event-stream",
                                     headers=audio_headers(job, stream))
        return StreamingResponse(audio_bytes(stream, job), media_type=_content_type(job),
                                 headers=audio_headers(job, stream))

    fish_ref = {"$ref": "#/components/schemas/FishTTSRequest"}

    @app.post("/v1/tts", dependencies=auth, tags=["speech"], openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": fish_ref},
                                      "application/msgpack": {"schema": fish_ref}}}})
    async def tts(request: Request):
        """fish-speech-compatible; JSON (base64 reference audio) or msgpack (raw bytes)."""
        holder.require()
        job = fish_job(parse_body(await request.body(), request.headers.get("content-type")), holder.voices)
        stream = await submit(job)
        if job.streaming:
            return StreamingResponse(audio_bytes(stream, job), media_type=_content_type(job),
                                     headers=audio_headers(job, stream))
        result = await until_disconnect(request, whole(stream, job), stream)
        return Response(result.data, media_type=result.content_type, headers=audio_headers(job, stream))

    # ---- voices -------------------------------------------------------------------------------
    def store() -> VoiceStore:
        holder.require()
        return holder.voices

    @app.post("/v1/references/add", dependencies=auth, tags=["voices"], status_code=201)
    async def add_reference(
            id: Annotated[str, Form(description="voice id: letters, digits, space, _ or -, <= 64 characters")],
            text: Annotated[str, Form(description="transcript of the audio")],
            audio: Annotated[UploadFile, File(description="reference audio (wav, flac, mp3, ogg)")]):
        if check_id(id) == "default":
            raise ApiError(400, "'default' is reserved (it means: no reference voice)")
        data = await audio.read(server.max_upload_bytes + 1)
        if len(data) > server.max_upload_bytes:
            raise ApiError(413, f"audio over {server.max_upload_bytes} bytes", "too_large")
        voices = store()
        if id in voices.ids():
            raise ApiError(409, f"voice {id!r} already exists (delete it first)")
        voice = await run_in_threadpool(voices.add, id, data, text, audio.filename or "audio.wav")
        return {"success": True, "reference_id": voice.id, "seconds": round(voice.seconds, 2),
                "message": f"voice {voice.id!r} added"}

    @app.get("/v1/references/list", dependencies=auth, tags=["voices"])
    async def list_references():
        return {"success": True, "reference_ids": store().ids()}

    @app.delete("/v1/references/delete", dependencies=auth, tags=["voices"])
    async def delete_reference(request: Request, reference_id: str | None = None):
        if reference_id is None:  # upstream sends it in a JSON body
            raw = await request.body()
            reference_id = parse_body(raw, request.headers.get("content-type")).get("reference_id") if raw else None
        if reference_id is None:
            raise ApiError(400, "reference_id is required (query parameter or JSON body)")
        if not await run_in_threadpool(store().delete, check_id(reference_id)):
            raise ApiError(404, f"voice {reference_id!r} not found")
        return {"success": True, "message": f"voice {reference_id!r} deleted"}

    @app.get("/v1/voices", dependencies=auth, tags=["voices"])
    async def voices():
        return {"default": "default", "voices": [{"id": "default", "text": "", "seconds": 0},
                                                 *await run_in_threadpool(store().summary)]}

    def openapi() -> dict:
        """The generated schema plus the fish-speech body models (/v1/tts parses its body itself to take
        JSON and msgpack, so FastAPI cannot see them)."""
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            fish = FishTTSRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(fish.pop("$defs", {}))
            components["FishTTSRequest"] = fish
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    return app


def _content_type(job: SpeechJob) -> str:
    return CONTENT_TYPES[job.format]


async def until_disconnect(request: Request, work, stream):
    """Awaits `work`, cancelling the generation if the client goes away first."""
    task = asyncio.ensure_future(work)
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if not done and await request.is_disconnected():
            stream.cancel()
            task.cancel()
            raise ApiError(499, "client closed the connection")
    return task.result()

