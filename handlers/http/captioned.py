"""`POST /v1/audio/speech/captioned`: the OpenAI speech body; the answer is the whole audio (base64, in the
requested format) with one caption per text chunk, timed exactly by that chunk's frames (the audio's own
duration per frame, so `speed` is accounted for), as a list and as SRT and WebVTT text. Not streamed: a cue's
end is known only when its chunk is done.
"""

from __future__ import annotations

import base64

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ttsengine import caption_cues, render_captions, whole
from ttsengine.serving.protocol import OpenAISpeechRequest, openai_job, unknown_fields, validate

from .body import json_body
from .errors import ApiError
from .metrics import watch_speech
from .routes import Server, Svc, audio_headers, body_schema, until_disconnect

router = APIRouter()


@router.post("/v1/audio/speech/captioned", tags=["speech"], openapi_extra=body_schema("OpenAISpeechRequest"))
async def captioned_speech(request: Request, svc: Svc, server: Server):
    """JSON: {audio (base64), content_type, sample_rate, seed, seconds, captions: [{start, end, text}], srt,
    vtt}; one caption per text chunk."""
    body = await json_body(request)
    req = validate(OpenAISpeechRequest, body, server.strict_fields)
    svc.require()
    job = openai_job(req, svc.voices, aliases=dict(server.voice_aliases))
    if job.sse:
        raise ApiError(400, "stream_format: captioned speech comes whole, as one JSON answer (not SSE)")
    stream = await svc.admit(job.request, request.is_disconnected)
    tally = watch_speech(request, job, stream)  # in the speech histograms like /v1/audio/speech
    result = await until_disconnect(request, whole(stream, job, tally), stream)
    frames = stream.frames
    cues = caption_cues(stream.reports, result.seconds / frames if frames else 0.0)
    headers = audio_headers(job, stream, unknown_fields(OpenAISpeechRequest, body))
    headers.pop("Content-Disposition", None)  # the answer is JSON, not a file
    return JSONResponse({
        "audio": base64.b64encode(result.data).decode(), "content_type": result.content_type,
        "sample_rate": result.sample_rate, "seed": stream.seed, "seconds": round(result.seconds, 3),
        "captions": [{"start": round(c.start, 3), "end": round(c.end, 3), "text": c.text} for c in cues],
        "srt": render_captions(cues, "srt"), "vtt": render_captions(cues, "vtt")}, headers=headers)
