"""The HTTP app, assembled: the service (the engines load in the background, so /health answers at once and
/ready says 503 until one engine is warm), the middlewares (body limit, request counts), the JSON error
handlers, the routes (routes.py) and the OpenAPI schema. Nothing returns a stack trace.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from ttsengine import EngineConfig, Fleet, ServerConfig
from ttsengine.serving.body_limit import BodyLimit
from ttsengine.serving.listen import HeadAsGet
from ttsengine.serving.protocol import FishTTSRequest
from ttsengine.serving.service import Service, engine_loader

from .errors import add_error_handlers, error_body
from .metrics import CountRequests, RequestCounter
from .routes import router


def create_app(server: ServerConfig, engine_config: EngineConfig,
               engine_factory: Callable[[], Fleet] | None = None) -> FastAPI:
    service = Service(engine_factory or engine_loader(engine_config), server.data_dir / "voices")

    async def lifespan(app: FastAPI):
        service.start()
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="fish-tts-server", version="0.1.0", lifespan=lifespan,
                  description="Fish-Speech / OpenAudio S1-mini text to speech.")
    app.state.service, app.state.server, app.state.counter = service, server, RequestCounter()
    app.add_middleware(CountRequests, counter=app.state.counter)
    app.add_middleware(BodyLimit, limit=server.max_body_bytes,
                       reply=lambda e: error_body(str(e), "too_large", e.status))
    app.add_middleware(HeadAsGet)  # outermost: HEAD is counted and limited as the GET it becomes
    add_error_handlers(app)
    app.include_router(router)
    app.openapi = lambda: openapi(app)
    return app


def openapi(app: FastAPI) -> dict:
    """The generated schema plus the fish-speech body models (/v1/tts parses its body itself to take JSON and
    msgpack, so FastAPI cannot see them)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        fish = FishTTSRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(fish.pop("$defs", {}))
        components["FishTTSRequest"] = fish
        app.openapi_schema = schema
    return app.openapi_schema
