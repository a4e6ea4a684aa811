"""What OpenAI-style clients list before they speak: `GET /v1/models` (OpenAI's list shape) and
`GET /v1/audio/voices` (Kokoro-FastAPI's: `{"voices": [{"id", "name"}, ...]}`, plain ids with ?legacy=true).
One model is served; the OpenAI model names are listed because clients pick from this list and the speech
route accepts any model name.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from ttsengine.serving.protocol import DEFAULT_VOICES, OPENAI_VOICES

from .errors import ApiError
from .routes import Server, Svc, store

router = APIRouter()
MODELS = ("s1-mini", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
CREATED = 1748908800  # 2025-06-03, when OpenAudio S1 was published: OpenAI's objects carry a creation time


def model_object(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": CREATED, "owned_by": "fishaudio"}


@router.get("/v1/models", tags=["models"])
async def models():
    """Every model name the speech route takes (all of them are S1-mini)."""
    return {"object": "list", "data": [model_object(m) for m in MODELS]}


@router.get("/v1/models/{model_id}", tags=["models"])
async def model(model_id: str):
    if model_id not in MODELS:
        raise ApiError(404, f"model {model_id[:200]!r} not found; served: {', '.join(MODELS)}")
    return model_object(model_id)


@router.get("/v1/audio/voices", tags=["voices"])
async def audio_voices(request: Request, svc: Svc, server: Server, legacy: bool = False):
    """Every voice name the speech route takes, as it resolves them: `default`, the stored voices (but those a
    configured alias shadows), then the aliases with the voice each stands for (TTS_VOICE_ALIASES, then OpenAI's
    names that no stored voice takes). A configured alias whose voice is not stored (deleted, renamed, not yet
    added) is left out: asking for it is a 400, so a client that picks from this list never meets it."""
    stored = await run_in_threadpool(store(svc).ids)
    configured = dict(server.voice_aliases)
    live = {a: target for a, target in configured.items() if target in DEFAULT_VOICES or target in stored}
    aliases = {**live, **{name: "default" for name in OPENAI_VOICES if name not in {*configured, *stored}}}
    entries = [{"id": "default", "name": "default"},
               *({"id": v, "name": v} for v in stored if v.lower() not in configured),
               *({"id": a, "name": a, "alias_of": target} for a, target in aliases.items())]
    if legacy:
        return {"voices": [e["id"] for e in entries]}
    return {"voices": entries}
