"""Transport-neutral requests: the OpenAI speech schema and fish-speech's /v1/tts schema, parsed and
validated into one `SpeechJob` (a SynthesisRequest plus how to deliver the audio). Every adapter
(HTTP, SageMaker, RunPod) uses these, so they accept the same fields with the same errors.

Audio encoding lives in audio/encode.py; bodies may be JSON or msgpack.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..audio.encode import FORMATS, check_output
from ..errors import InputError, MediaTypeError
from ..synthesis.request import Reference, SynthesisRequest
from .voices import VoiceStore

AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
DEFAULT_VOICES = ("default", "")  # OpenAI-style requests with these voices use no reference


class OpenAISpeechRequest(BaseModel):
    """OpenAI `POST /v1/audio/speech`, plus optional sampling fields of this server."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field("s1-mini", max_length=200, description="accepted for compatibility; one model is served")
    input: str = Field(..., description="text to speak")
    voice: str | None = Field(None, description="a stored voice id (GET /v1/voices); 'default' or absent: none")
    response_format: AudioFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="tempo, pitch kept")
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = Field(None, description="accepted and ignored: S1 has no instruction input")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description="default: 24000 for pcm, 48000 for opus, "
                                                                          "else 44100")
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None


class FishReference(BaseModel):
    model_config = ConfigDict(extra="forbid")
    audio: bytes | str = Field(..., description="audio bytes (msgpack) or base64 text (JSON)")
    text: str = ""


class FishTTSRequest(BaseModel):
    """fish-speech `POST /v1/tts` (ServeTTSRequest at d3df505), plus opus/flac/aac and sample_rate."""

    model_config = ConfigDict(extra="forbid")
    text: str
    chunk_length: int = 200
    format: AudioFormat = "wav"
    references: list[FishReference] = []
    reference_id: str | None = None
    seed: int | None = None
    use_memory_cache: Literal["on", "off"] = "off"  # accepted; encoded references are always cached by content
    normalize: bool = True  # accepted; unused in S1 (as upstream)
    latency: Literal["normal", "balanced"] = "normal"  # fish-speech's client always sends it; accepted, ignored
    streaming: bool = False
    # None: the server's defaults, which are upstream's (1024 frames, 0.8, 1.1, 0.8) unless configured
    max_new_tokens: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    temperature: float | None = None
    sample_rate: int | None = Field(None, ge=8000, le=48000)


@dataclass(frozen=True)
class SpeechJob:
    request: SynthesisRequest
    format: str
    sample_rate: int | None
    speed: float
    streaming: bool
    sse: bool = False
    characters: int = 0


MAX_DEPTH = 32  # nesting a body may have (ours nest 3 deep: body -> references -> reference)
MAX_INT = 2**64  # no field takes a larger integer (seeds are 64-bit)


def parse_body(raw: bytes, content_type: str | None) -> dict:
    """JSON or msgpack (by content type; JSON when none is given) -> dict. Guarded: nesting deeper than
    MAX_DEPTH and integers of 64 bits or more are an InputError (one line), never a RecursionError or the
    interpreter's 4300-digit ValueError."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    if ctype in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
        import msgpack

        try:
            body = msgpack.unpackb(raw, raw=False)
        except Exception as e:  # msgpack raises several types for bad input (StackError: nested too deep)
            raise InputError(f"body is not valid msgpack: {type(e).__name__}") from None
    elif ctype in ("application/json", "text/json"):
        try:
            body = json.loads(raw or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"body is not valid JSON: {e}") from None
        except RecursionError:
            raise InputError(f"body is nested too deeply (the limit is {MAX_DEPTH} levels)") from None
        except ValueError:  # the interpreter's limit on integer digits (sys.get_int_max_str_digits)
            raise InputError("body has an integer with too many digits (the limit is 64 bits)") from None
    else:
        raise MediaTypeError(f"unsupported content type {ctype!r}: use application/json or application/msgpack")
    if not isinstance(body, dict):
        raise InputError("body must be an object")
    _check_shape(body)
    return body


def _check_shape(body: dict) -> None:
    """Iteratively (no recursion): depth <= MAX_DEPTH, every integer within +-MAX_INT."""
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise InputError(f"body is nested too deeply (the limit is {MAX_DEPTH} levels)")
            items = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
        elif isinstance(value, int) and not -MAX_INT < value < MAX_INT:
            raise InputError("body has an integer with too many digits (the limit is 64 bits)")


def _validate(model: type[BaseModel], body: dict) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise InputError(f"{where}: {err.get('msg', 'invalid')}{more}") from None


def _voice_reference(voice: str, voices: VoiceStore | None) -> tuple[Reference, ...]:
    found = voices.get(voice) if voices is not None else None
    if found is None:
        available = voices.ids() if voices is not None else []
        raise InputError(f"unknown voice {voice!r}; available: {', '.join(['default', *available])}")
    return (Reference(text=found.text, codes=found.codes),)


def openai_job(body: dict | OpenAISpeechRequest, voices: VoiceStore | None) -> SpeechJob:
    """A body is validated here, once; a request FastAPI already validated is taken as it is."""
    req = body if isinstance(body, OpenAISpeechRequest) else _validate(OpenAISpeechRequest, body)
    refs = () if req.voice is None or req.voice in DEFAULT_VOICES else _voice_reference(req.voice, voices)
    synth = SynthesisRequest(text=req.input, references=refs, seed=req.seed, temperature=req.temperature,
                             top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                             max_new_tokens=req.max_new_tokens)
    check_output(req.response_format, req.sample_rate, req.speed)
    return SpeechJob(synth, req.response_format, req.sample_rate, req.speed, streaming=True,
                     sse=req.stream_format == "sse", characters=len(req.input))


def _audio_bytes(value: bytes | str, where: str) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{where}: not valid base64") from None


def fish_job(body: dict | FishTTSRequest, voices: VoiceStore | None) -> SpeechJob:
    req = body if isinstance(body, FishTTSRequest) else _validate(FishTTSRequest, body)
    if req.reference_id:  # takes precedence over inline references, as upstream
        refs = _voice_reference(req.reference_id, voices)
    else:
        refs = tuple(Reference(text=r.text, audio=_audio_bytes(r.audio, f"references.{i}.audio"))
                     for i, r in enumerate(req.references))
    synth = SynthesisRequest(text=req.text, references=refs, seed=req.seed, temperature=req.temperature,
                             top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                             max_new_tokens=req.max_new_tokens,
                             # upstream declares 100..300 but ignores the field; clamp to what splitting supports
                             chunk_length=max(50, min(1000, req.chunk_length)))
    check_output(req.format, req.sample_rate, 1.0)
    return SpeechJob(synth, req.format, req.sample_rate, 1.0, streaming=req.streaming, characters=len(req.text))


def job_from_body(body: dict, voices: VoiceStore | None, check_only: bool = False) -> SpeechJob:
    """Either schema, told apart by its text field: `input` means OpenAI's fields, `text` fish-speech's.
    check_only validates without looking voices up (they may need a loaded model)."""
    body = dict(body)
    if "input" in body:
        if check_only and body.get("voice") not in (None, *DEFAULT_VOICES):
            body["voice"] = None
        return openai_job(body, voices)
    if "text" in body:
        if check_only:
            body.pop("reference_id", None)
        return fish_job(body, voices)
    raise InputError("the body needs `text` (fish-speech /v1/tts fields) or `input` (OpenAI speech fields)")


__all__ = ["FORMATS", "FishTTSRequest", "OpenAISpeechRequest", "SpeechJob", "fish_job", "job_from_body", "openai_job",
           "parse_body"]
