"""The HTTP routes: OpenAI `/v1/audio/speech`, fish-speech `/v1/tts`, voices, health/ready/metrics and the web
page. They reach the engine through the app's Service and read the settings from app.state (create_app puts
`service`, `server` and `metrics` there), so the router holds no state of its own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile as FormFile

from ttsengine import (
    CONTENT_TYPES,
    EngineDown,
    ServerConfig,
    VoiceStore,
    audio_bytes,
    check_id,
    model_origin,
    output_rate,
    sse_events,
    whole,
)
from ttsengine.serving.protocol import (
    FishTTSRequest,
    OpenAISpeechRequest,
    ReferenceUpdate,
    SpeechJob,
    fish_job,
    ignored_header,
    openai_job,
    unknown_fields,
    validate,
)
from ttsengine.serving.service import Service

from .audio_stream import AudioStream
from .body import FORM_TYPES, form_only, json_body, media_type, optional_json_body
from .downloads import keep_stream, keep_whole
from .errors import ApiError
from .metrics import CONTENT_TYPE, watch_speech

STATIC = Path(__file__).parent / "static"


# async, so FastAPI calls them on the event loop: a sync dependency runs in the shared thread pool, where it
# would queue behind user work and hold up /health (issue 50)
async def get_service(request: Request) -> Service:
    return request.app.state.service


async def get_server(request: Request) -> ServerConfig:
    return request.app.state.server


Svc = Annotated[Service, Depends(get_service)]
Server = Annotated[ServerConfig, Depends(get_server)]
router = APIRouter()


def body_schema(name: str) -> dict:
    """The OpenAPI request body of a route that reads its body itself (json_body: JSON or msgpack, so FastAPI
    cannot see the model; app.openapi adds the named schema)."""
    ref = {"schema": {"$ref": f"#/components/schemas/{name}"}}
    return {"requestBody": {"required": True, "content": {"application/json": ref, "application/msgpack": ref}}}


# ---- health -------------------------------------------------------------------------------------------------
@router.get("/health", tags=["health"])
@router.get("/v1/health", tags=["health"])  # fish-speech's server has it
async def health(svc: Svc):
    """ok | degraded (an engine is out of service; the others serve) | loading: 200; failed (none can serve): 500.
    Each engine's device and state once loaded."""
    report = svc.health()
    return JSONResponse(report, status_code=500 if report["status"] == "failed" else 200)


@router.get("/ready", tags=["health"])
async def ready(request: Request, svc: Svc, server: Server):
    """200 while at least one engine serves (the others may still warm up or be out of service), with each; with
    TTS_READY_WHEN=settled (default) only once its graphs left for later are captured (503 "warming" before).
    `model` says which model is served: its directory and the source it was fetched from (compose's volume)."""
    if svc.error:
        return JSONResponse({"status": "failed", "error": svc.error}, status_code=503)
    if svc.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not svc.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    try:
        stats = svc.stats()  # one snapshot for all below: with engine processes each is a round trip to every one
    except EngineDown as e:
        return JSONResponse({"status": "failed", "error": str(e)}, status_code=503)
    pending = svc.warming(server.ready_when, server.ready_max_wait, stats)
    if pending:
        return JSONResponse({"status": "warming", "graphs_pending": pending}, status_code=503)
    total = stats.total
    preset = total.memory_preset.as_dict() if total.memory_preset is not None else None
    if getattr(request.app.state, "model", None) is None:  # read once: the served model does not change
        request.app.state.model = model_origin(request.app.state.model_dir)
    return {"status": "ready", "model": request.app.state.model, "warmup_seconds": total.warmup_seconds,
            "quantization": total.quantization, "kernel_cache": total.kernel_cache, "memory_preset": preset,
            "max_streams": total.max_streams, "kv_positions": total.kv_positions,
            "graphs_pending": total.graphs_pending, "engines": svc.health(stats)["engines"]}


@router.get("/metrics", tags=["health"], response_class=PlainTextResponse)
async def metrics(request: Request):
    """Prometheus text (the names: docs/http-api.md, "Metrics")."""
    text = await run_in_threadpool(request.app.state.metrics.exposition)  # NVML reads can take milliseconds
    return Response(text, media_type=CONTENT_TYPE)


@router.get("/", include_in_schema=False)
async def index():
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers=page_headers(page))


def page_headers(page: str) -> dict[str, str]:
    """The page may run only its own inline script and style (by their hashes: nothing injected runs), talk only to
    this server, play audio it made (blob: URLs for the download link), and not be framed by another site."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)

    csp = (f"default-src 'self'; script-src {hashes('script')}; style-src {hashes('style')}; img-src 'self' data:; "
           "media-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
    return {"Content-Security-Policy": csp, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"}


# ---- speech -------------------------------------------------------------------------------------------------
@router.post("/v1/audio/speech", tags=["speech"], openapi_extra=body_schema("OpenAISpeechRequest"),
             responses={200: {"content": {"audio/mpeg": {}, "text/event-stream": {}}}})
async def speech(request: Request, svc: Svc, server: Server):
    """OpenAI-compatible speech; the audio streams as it is generated (chunked transfer or SSE), or comes whole
    with `stream: false` (Kokoro-FastAPI's field)."""
    body = await json_body(request)
    req = validate(OpenAISpeechRequest, body, server.strict_fields)  # a bad body is a 400 even while loading
    svc.require()  # a loading model answers 503 before the voice lookup says "unknown voice"
    job = openai_job(req, svc.voices, aliases=dict(server.voice_aliases))
    return await respond(request, svc, job, unknown_fields(OpenAISpeechRequest, body))


@router.post("/v1/tts", tags=["speech"], openapi_extra=body_schema("FishTTSRequest"))
async def tts(request: Request, svc: Svc, server: Server):
    """fish-speech-compatible; JSON (base64 reference audio) or msgpack (raw bytes)."""
    body = await json_body(request)
    svc.require()
    job = fish_job(body, svc.voices, strict=server.strict_fields)
    return await respond(request, svc, job, unknown_fields(FishTTSRequest, body))


async def respond(request: Request, svc: Service, job: SpeechJob, ignored: tuple[str, ...]) -> Response:
    """One job's audio: SSE events, a stream, or one whole file (exact sizes), kept behind a download link
    when the job asks. Streamed answers (audio or SSE) send their headers with the first audio, so a failure
    before it is the JSON error with its status."""
    stream = await svc.admit(job.request, request.is_disconnected)  # given up if the client leaves meanwhile
    try:
        return await _answer(request, job, ignored, stream)
    except BaseException:
        stream.cancel()  # no response will read it: free the engine slot now
        raise


async def _answer(request: Request, job: SpeechJob, ignored: tuple[str, ...], stream) -> Response:
    tally = watch_speech(request, job, stream)  # the metrics read it when the response has gone out
    headers = audio_headers(job, stream, ignored)
    if job.sse:
        return AudioStream(sse_events(stream, job, tally), media_type="text/event-stream", headers=headers)
    downloads = request.app.state.downloads if job.download_link else None
    if job.streaming:
        chunks = audio_bytes(stream, job, tally)
        if downloads is not None:
            chunks = keep_stream(downloads, job.format, chunks, headers)
        return AudioStream(chunks, media_type=CONTENT_TYPES[job.format], headers=headers)
    result = await until_disconnect(request, whole(stream, job, tally), stream)
    if downloads is not None:
        headers.update(await keep_whole(downloads, job.format, result.data))
    return Response(result.data, media_type=result.content_type, headers=headers)


def audio_headers(job: SpeechJob, stream, ignored: tuple[str, ...] = ()) -> dict:
    rate = output_rate(job.format, stream.sample_rate, job.sample_rate)  # the rate the audio is encoded at
    headers = {"X-Seed": str(stream.seed), "X-Sample-Rate": str(rate), "Cache-Control": "no-store",
               # a name for browsers and `curl -OJ`; inline, so a browser plays it rather than saving it
               "Content-Disposition": f'inline; filename="speech.{job.format}"'}
    # tolerant reading (TTS_STRICT_FIELDS off): say what was dropped, so a typo is not silent
    return {**headers, **ignored_header(ignored)}


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


@router.post("/v1/references/add", dependencies=[Depends(form_only)], tags=["voices"], status_code=201)
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


@router.get("/v1/references/list", tags=["voices"])
async def list_references(svc: Svc):
    return {"success": True, "reference_ids": store(svc).ids()}


@router.delete("/v1/references/delete", tags=["voices"])
async def delete_reference(request: Request, svc: Svc, reference_id: str | None = None):
    if reference_id is None:  # upstream sends it in a JSON body
        body = await optional_json_body(request)
        reference_id = body.get("reference_id") if body else None
    if reference_id is None:
        raise ApiError(400, "reference_id is required (query parameter or JSON body)")
    if not await run_in_threadpool(store(svc).delete, check_id(reference_id)):
        raise ApiError(404, f"voice {reference_id!r} not found")
    return {"success": True, "message": f"voice {reference_id!r} deleted"}


@router.get("/v1/voices", tags=["voices"])
async def voices(svc: Svc):
    return {"default": "default", "voices": [{"id": "default", "text": "", "seconds": 0},
                                             *await run_in_threadpool(store(svc).summary)]}


@router.post("/v1/references/update", tags=["voices"], openapi_extra={"requestBody": {
    "required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ReferenceUpdate"}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["id", "text", "audio"], "properties": {
            "id": {"type": "string"}, "text": {"type": "string"},
            "audio": {"type": "string", "format": "binary"}}}}}}})
async def update_reference(request: Request, svc: Svc, server: Server):
    """Rename a stored voice (fish-speech's body: JSON or msgpack `old_reference_id`, `new_reference_id`), or
    replace its audio and transcript (multipart `id`, `text`, `audio`, as /v1/references/add)."""
    if media_type(request) in FORM_TYPES:
        return await replace_reference(request, svc, server)
    body = await json_body(request)
    update = validate(ReferenceUpdate, body, server.strict_fields)
    old, new = check_id(update.old_reference_id), check_id(update.new_reference_id)
    if new == "default":
        raise ApiError(400, "'default' is reserved (it means: no reference voice)")
    if not await run_in_threadpool(store(svc).rename, old, new):
        raise ApiError(404, f"voice {old!r} not found")
    return {"success": True, "message": f"voice {old!r} renamed to {new!r}", "old_reference_id": old,
            "new_reference_id": new}


async def replace_reference(request: Request, svc: Service, server: ServerConfig) -> dict:
    form = await request.form(max_files=1, max_fields=8)
    voice_id, text, audio = form.get("id"), form.get("text"), form.get("audio")
    if not isinstance(voice_id, str) or not isinstance(text, str) or not isinstance(audio, FormFile):
        raise ApiError(400, "replacing a voice takes multipart fields id, text and audio (a file)")
    voices = store(svc)
    if check_id(voice_id) not in voices.ids():
        raise ApiError(404, f"voice {voice_id!r} not found (add it with /v1/references/add)")
    data = await audio.read(server.max_upload_bytes + 1)
    if len(data) > server.max_upload_bytes:
        raise ApiError(413, f"audio over {server.max_upload_bytes} bytes", "too_large")
    voice = await run_in_threadpool(voices.replace, voice_id, data, text, audio.filename or "audio.wav")
    return {"success": True, "reference_id": voice.id, "seconds": round(voice.seconds, 2),
            "message": f"voice {voice.id!r} replaced"}
