"""The HTTP app, assembled: the service (the engines load in the background, so /health answers at once and
/ready says 503 until one engine is warm), the middlewares (body limit, metrics, CORS when configured),
the JSON error handlers, the routes (routes.py, catalog.py, downloads.py), the OpenAPI schema and its offline
/docs page (docs.py). Nothing returns a stack trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.concurrency import run_in_threadpool

from ttsengine import EngineConfig, Fleet, ServerConfig
from ttsengine.serving import chunk_trace
from ttsengine.serving.audio_store import AudioStore
from ttsengine.serving.delivery import close_encoders, start_encoders
from ttsengine.serving.network import loop_lag
from ttsengine.serving.network.api_key import ApiKey, CrossSite
from ttsengine.serving.network.body_limit import BodyLimit
from ttsengine.serving.network.listen import HeadAsGet
from ttsengine.serving.protocol import FishTTSRequest, OpenAISpeechRequest, ReferenceUpdate
from ttsengine.serving.service import Service, engine_loader

from . import captioned, catalog, downloads, live, live_elevenlabs
from .docs import add_docs
from .errors import add_error_handlers, document_errors, error_body
from .metrics import HttpMetrics, Instrument
from .routes import router

# what a browser app on another origin may send and read (TTS_CORS_ORIGINS): the key, JSON, and our headers
CORS_HEADERS = ["Authorization", "Content-Type", "X-Api-Key"]
CORS_EXPOSED = ["X-Seed", "X-Sample-Rate", "X-Download-Path", "X-Download-URL", "X-Download-Status",
                "X-Ignored-Fields", "Content-Disposition", "Retry-After"]


def create_app(server: ServerConfig, engine_config: EngineConfig,
               engine_factory: Callable[[], Fleet] | None = None) -> FastAPI:
    service = Service(engine_factory or engine_loader(engine_config), server.data_dir / "voices",
                      engine_config.features)

    async def lifespan(app: FastAPI):
        service.start()
        await run_in_threadpool(start_encoders)  # the mp3/opus workers now, not in the first streams' time
        lag = asyncio.create_task(loop_lag.watch(app.state.metrics.loop_lag.observe))
        yield
        lag.cancel()
        await run_in_threadpool(service.close)
        await run_in_threadpool(close_encoders)  # after the drain: the last streams have ended

    app = FastAPI(title="fish-tts-server", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Fish-Speech / OpenAudio S1-mini text to speech.")
    chunk_trace.enable(server.trace_chunks)  # before the metrics: they add the trace series only when on
    app.state.service, app.state.server, app.state.metrics = service, server, HttpMetrics(service)
    app.state.model_dir, app.state.model = engine_config.model_dir, None  # /ready's "model"
    app.state.downloads = AudioStore(server.data_dir / "downloads", server.download_ttl, server.download_max_bytes,
                                     server.download_max_files)
    # innermost first: the key is checked before anything reads the body; the metrics see every answer, the
    # 401s and the body limit's 413/408 included
    app.add_middleware(ApiKey, key=server.api_key, reply=lambda m, status: error_body(
        m, "authentication_error" if status == 401 else "invalid_request_error", status))
    if not server.api_key:  # a key needs a preflight to send cross-site; without one, other sites' forms would work
        app.add_middleware(CrossSite, allowed=server.cors_origins,
                           reply=lambda m: error_body(m, "permission_error", 403))
    app.add_middleware(BodyLimit, limit=server.max_body_bytes, read_timeout=server.read_timeout,
                       min_rate=server.body_min_rate, rate_grace=server.body_rate_grace,
                       body_timeout=server.body_timeout,
                       reply=lambda e: error_body(str(e), body_error_kind(e.status), e.status))
    app.add_middleware(Instrument, metrics=app.state.metrics)
    app.add_middleware(HeadAsGet)  # HEAD is counted and limited as the GET it becomes
    if server.cors_origins:  # outermost: preflights are answered before auth, and errors carry the CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=list(server.cors_origins), allow_headers=CORS_HEADERS,
                           allow_methods=["GET", "HEAD", "POST", "DELETE"], expose_headers=CORS_EXPOSED,
                           max_age=600)
    add_error_handlers(app)
    app.include_router(router)
    app.include_router(catalog.router)
    app.include_router(captioned.router)
    app.include_router(downloads.router)
    app.include_router(live.router)  # WebSocket /v1/tts/live
    app.include_router(live_elevenlabs.router)  # ElevenLabs' WebSockets /v1/text-to-speech/{voice_id}/...
    add_docs(app)
    app.openapi = lambda: openapi(app)
    return app


def body_error_kind(status: int) -> str:
    """413 too large; 503 too many connections open; 408 (the headers or body came too slowly) and the rest."""
    return {413: "too_large", 503: "server_busy"}.get(status, "invalid_request_error")


def openapi(app: FastAPI) -> dict:
    """The generated schema plus the body models of the routes that parse their body themselves (to take JSON
    and msgpack and answer 415 for anything else), which FastAPI cannot see."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (OpenAISpeechRequest, FishTTSRequest, ReferenceUpdate):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        document_errors(schema, keyed=bool(app.state.server.api_key))
        app.openapi_schema = schema
    return app.openapi_schema
