"""The HTTP routes: OpenAI `/v1/audio/speech`, fish-speech `/v1/tts`, voices, health/ready/metrics and the web
page. They reach the engine through the app's Service and read the settings from app.state (create_app puts
`service`, `server` and `counter` there), so the router holds no state of its own.
"""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ttsengine import CONTENT_TYPES, ServerConfig, VoiceStore, audio_bytes, check_id, output_rate, sse_events, whole
from ttsengine.serving.protocol import OpenAISpeechRequest, SpeechJob, fish_job, openai_job, parse_body
from ttsengine.serving.service import Service

from .audio_stream import AudioStream
from .errors import ApiError
from .metrics import render

STATIC = Path(__file__).parent / "static"


def get_service(request: Request) -> Service:
    return request.app.state.service


def get_server(request: Request) -> ServerConfig:
    return request.app.state.server


def check_key(request: Request) -> None:
    key = get_server(request).api_key
    if not key:
        return
    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error",
                       {"WWW-Authenticate": "Bearer"})


Svc = Annotated[Service, Depends(get_service)]
Server = Annotated[ServerConfig, Depends(get_server)]
AUTH = [Depends(check_key)]
FISH_REF = {"$ref": "#/components/schemas/FishTTSRequest"}
router = APIRouter()


# ---- health -------------------------------------------------------------------------------------------------
@router.get("/health", tags=["health"])
@router.get("/v1/health", tags=["health"])  # fish-speech's server has it
async def health(svc: Svc):
    """ok | degraded (an engine is out of service; the others serve) | loading: 200; failed (none can serve): 500.
    Each engine's device and state once loaded."""
    report = svc.health()
    return JSONResponse(report, status_code=500 if report["status"] == "failed" else 200)


@router.get("/ready", tags=["health"])
async def ready(svc: Svc):
    """200 while at least one engine serves (the others may still warm up or be out of service), with each."""
    if svc.error:
        return JSONResponse({"status": "failed", "error": svc.error}, status_code=503)
    if svc.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not svc.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    stats = svc.stats()
    return {"status": "ready", "warmup_seconds": stats["warmup_seconds"], "quantization": stats["quantization"],
            "kernel_cache": stats["kernel_cache"], "memory_preset": stats.get("memory_preset"),
            "max_streams": stats.get("max_streams"), "kv_positions": stats.get("kv_positions"),
            "engines": svc.health()["engines"]}


@router.get("/metrics", tags=["health"], response_class=PlainTextResponse)
async def metrics(request: Request, svc: Svc):
    text = render(request.app.state.counter, svc.stats(), svc.ready)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/", include_in_schema=False)
async def index():
    return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))


# ---- speech -------------------------------------------------------------------------------------------------
@router.post("/v1/audio/speech", dependencies=AUTH, tags=["speech"],
             responses={200: {"content": {"audio/mpeg": {}, "text/event-stream": {}}}})
async def speech(body: OpenAISpeechRequest, svc: Svc):
    """OpenAI-compatible speech; the audio streams as it is generated (chunked transfer or SSE)."""
    svc.require()  # a loading model answers 503 before the voice lookup says "unknown voice"
    job = openai_job(body, svc.voices)  # FastAPI validated the body: not again
    stream = await run_in_threadpool(svc.submit, job.request)
    if job.sse:
        return StreamingResponse(sse_events(stream, job), media_type="text/event-stream",
                                 headers=audio_headers(job, stream))
    return AudioStream(audio_bytes(stream, job), media_type=CONTENT_TYPES[job.format],
                             headers=audio_headers(job, stream))


@router.post("/v1/tts", dependencies=AUTH, tags=["speech"], openapi_extra={"requestBody": {
    "required": True, "content": {"application/json": {"schema": FISH_REF},
                                  "application/msgpack": {"schema": FISH_REF}}}})
async def tts(request: Request, svc: Svc):
    """fish-speech-compatible; JSON (base64 reference audio) or msgpack (raw bytes)."""
    svc.require()
    job = fish_job(parse_body(await request.body(), request.headers.get("content-type")), svc.voices)
    stream = await run_in_threadpool(svc.submit, job.request)
    if job.streaming:
        return AudioStream(audio_bytes(stream, job), media_type=CONTENT_TYPES[job.format],
                                 headers=audio_headers(job, stream))
    result = await until_disconnect(request, whole(stream, job), stream)
    return Response(result.data, media_type=result.content_type, headers=audio_headers(job, stream))


def audio_headers(job: SpeechJob, stream) -> dict:
    rate = output_rate(job.format, stream.sample_rate, job.sample_rate)  # the rate the audio is encoded at
    return {"X-Seed": str(stream.seed), "X-Sample-Rate": str(rate), "Cache-Control": "no-store"}


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


# ---- voices -------------------------------------------------------------------------------------------------
def store(svc: Service) -> VoiceStore:
    svc.require()
    if svc.voices is None:
        raise ApiError(503, svc.voices_error or "stored voices are disabled (no TTS_DATA_DIR)")
    return svc.voices


@router.post("/v1/references/add", dependencies=AUTH, tags=["voices"], status_code=201)
async def add_reference(
        id: Annotated[str, Form(description="voice id: letters, digits, space, _ or -, <= 64 characters")],
        text: Annotated[str, Form(description="transcript of the audio")],
        audio: Annotated[UploadFile, File(description="reference audio (wav, flac, mp3, ogg)")],
        svc: Svc, server: Server):
    if check_id(id) == "default":
        raise ApiError(400, "'default' is reserved (it means: no reference voice)")
    data = await audio.read(server.max_upload_bytes + 1)
    if len(data) > server.max_upload_bytes:
        raise ApiError(413, f"audio over {server.max_upload_bytes} bytes", "too_large")
    voices = store(svc)
    if id in voices.ids():
        raise ApiError(409, f"voice {id!r} already exists (delete it first)")
    voice = await run_in_threadpool(voices.add, id, data, text, audio.filename or "audio.wav")
    return {"success": True, "reference_id": voice.id, "seconds": round(voice.seconds, 2),
            "message": f"voice {voice.id!r} added"}


@router.get("/v1/references/list", dependencies=AUTH, tags=["voices"])
async def list_references(svc: Svc):
    return {"success": True, "reference_ids": store(svc).ids()}


@router.delete("/v1/references/delete", dependencies=AUTH, tags=["voices"])
async def delete_reference(request: Request, svc: Svc, reference_id: str | None = None):
    if reference_id is None:  # upstream sends it in a JSON body
        raw = await request.body()
        reference_id = parse_body(raw, request.headers.get("content-type")).get("reference_id") if raw else None
    if reference_id is None:
        raise ApiError(400, "reference_id is required (query parameter or JSON body)")
    if not await run_in_threadpool(store(svc).delete, check_id(reference_id)):
        raise ApiError(404, f"voice {reference_id!r} not found")
    return {"success": True, "message": f"voice {reference_id!r} deleted"}


@router.get("/v1/voices", dependencies=AUTH, tags=["voices"])
async def voices(svc: Svc):
    return {"default": "default", "voices": [{"id": "default", "text": "", "seconds": 0},
                                             *await run_in_threadpool(store(svc).summary)]}
