"""Transport-neutral requests: the OpenAI speech schema and fish-speech's /v1/tts schema, parsed and
validated into one `SpeechJob` (a SynthesisRequest plus how to deliver the audio). Every adapter
(HTTP, SageMaker, RunPod) uses these, so they accept the same fields with the same errors.

Audio encoding lives in audio/encode.py; bodies may be JSON or msgpack.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..audio.encode import FORMATS, check_output
from ..errors import InputError, MediaTypeError
from ..synthesis.request import Reference, SynthesisRequest
from .voices import VoiceStore

AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
DEFAULT_VOICES = ("default", "")  # OpenAI-style requests with these voices use no reference
# OpenAI's built-in voices (openai-python's speech_create_params): clients send them, most examples use "alloy".
# Each means the model's own voice unless TTS_VOICE_ALIASES maps it, or a stored voice has that very id.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")
# Kokoro-FastAPI's voice ids: a language letter, f or m, "_", a name (af_bella, bm_george, jf_alpha), alone or mixed
# ("af_bella+af_sky", "af_bella(2)+af_sky(1)"). Clients written for Kokoro send them by default; like OpenAI's names
# they mean the model's own voice (S1 has no such speakers), unless an alias or a stored voice takes the name.
_KOKORO_ONE = r"[abefhijpz][fm]_[a-z]+(?:\(\d+(?:\.\d+)?\))?"
KOKORO_VOICE = re.compile(rf"{_KOKORO_ONE}(?:\+{_KOKORO_ONE})*")
# said in every unknown-voice error, so the "available" list is the whole truth
STANDING_FOR_DEFAULT = "OpenAI's voice names (alloy, nova, ...) and Kokoro's (af_bella, ...) mean default"


class VoiceID(BaseModel):
    """OpenAI's custom-voice form of `voice`: {"id": "..."}; here the id of a stored voice or an alias."""

    model_config = ConfigDict(extra="forbid")
    id: str


class OpenAISpeechRequest(BaseModel):
    """OpenAI `POST /v1/audio/speech`, Kokoro-FastAPI's extension fields, and this server's sampling fields."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field("s1-mini", max_length=200, description="accepted for compatibility; one model is served")
    input: str = Field(..., description="text to speak")
    voice: str | VoiceID | None = Field(
        None, description="a stored voice id (GET /v1/voices), an alias (TTS_VOICE_ALIASES; OpenAI's voice names "
                          "mean 'default' unless mapped), or {\"id\": ...}; 'default' or absent: the model's own")
    response_format: AudioFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="tempo, pitch kept")
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = Field(None, description="accepted and ignored (named in X-Ignored-Fields): S1 "
                                                        "has no instruction input")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description="default: 24000 for pcm, 48000 for opus, "
                                                                          "else 44100")
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    # Kokoro-FastAPI's extensions
    stream: bool = Field(True, description="false: one whole response with exact sizes (a WAV's real header)")
    volume_multiplier: float = Field(1.0, ge=0.0, le=10.0, description="scales the samples (clipped at full scale)")
    return_download_link: bool = Field(False, description="keep the finished file: X-Download-Path names it "
                                                          "(GET /v1 + that path)")
    lang_code: str | None = Field(None, max_length=32, description="accepted and ignored: S1 reads the text's "
                                                                   "language itself")
    normalization_options: dict | None = Field(None, description="accepted and ignored: S1 takes the text as is")


class FishProsody(BaseModel):
    """fish-audio's SDK sends it: speed (tempo, pitch kept) and volume in dB."""

    model_config = ConfigDict(extra="forbid")
    speed: float = Field(1.0, ge=0.5, le=2.0)
    volume: float = Field(0.0, ge=-20.0, le=20.0)


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
    # fish-audio's SDK always sends these (its TTSRequest model, dumped whole)
    mp3_bitrate: int | None = None  # accepted and ignored: mp3 is 128 kbit/s
    opus_bitrate: int | None = None  # accepted and ignored: opus is libopus's default for the rate
    prosody: FishProsody | None = None


class ReferenceUpdate(BaseModel):
    """fish-speech `POST /v1/references/update` (d3df505): rename a stored voice."""

    model_config = ConfigDict(extra="forbid")
    old_reference_id: str
    new_reference_id: str


@dataclass(frozen=True)
class SpeechJob:
    request: SynthesisRequest
    format: str
    sample_rate: int | None
    speed: float
    streaming: bool
    sse: bool = False
    characters: int = 0
    volume: float = 1.0  # sample scale before encoding (clipped at full scale)
    download_link: bool = False  # keep the finished file for GET /v1/download/{id}
    ignored: tuple[str, ...] = ()  # unknown top-level fields dropped by a tolerant reading (the adapter names them)


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


def ignored_header(names: tuple[str, ...], limit: int = 1000) -> dict[str, str]:
    """X-Ignored-Fields naming the fields a tolerant reading dropped ({} when none): a body's keys may hold any
    character, CR and LF included, and a header takes visible ASCII only, so each name is percent-encoded (commas
    too)."""
    return {"X-Ignored-Fields": ",".join(quote(str(n), safe="") for n in names)[:limit]} if names else {}


# fields clients send that are accepted (a strict reading would break those clients) but change nothing here: named
# beside the unknown ones, so a caller asking for `instructions` learns it had no effect
NO_EFFECT: dict[str, tuple[str, ...]] = {
    "OpenAISpeechRequest": ("instructions", "lang_code", "normalization_options"),
    "FishTTSRequest": ("normalize", "latency", "mp3_bitrate", "opus_bitrate"),
}


def unknown_fields(model: type[BaseModel], body: dict) -> tuple[str, ...]:
    """The body's top-level keys that have no effect, in body order: the ones the model does not know (dropped by a
    tolerant reading) and the known ones in NO_EFFECT given a value (X-Ignored-Fields, RunPod's ignored_fields)."""
    no_effect = NO_EFFECT.get(model.__name__, ())
    return tuple(str(k) for k in body if k not in model.model_fields or (k in no_effect and body[k] is not None))


def validate(model: type[BaseModel], body: dict, strict: bool = True) -> BaseModel:
    """body -> the model, or an InputError naming the first bad field. strict: an unknown field is one
    (pydantic's "Extra inputs are not permitted"); else it is dropped (the adapter names it: unknown_fields)."""
    if not strict:
        body = {k: v for k, v in body.items() if k in model.model_fields}
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise InputError(f"{where}: {err.get('msg', 'invalid')}{more}") from None


def _voice_reference(voice: str, voices: VoiceStore | None, alias: str = "") -> tuple[Reference, ...]:
    found = voices.get(voice) if voices is not None else None
    if found is None:
        available = voices.ids() if voices is not None else []
        via = f"{alias!r} stands for voice {voice!r} (TTS_VOICE_ALIASES), which is not stored" if alias else \
            f"unknown voice {voice!r}"
        raise InputError(f"{via}; available: {', '.join(['default', *available])}; {STANDING_FOR_DEFAULT}")
    return (Reference(text=found.text, codes=found.codes),)


def voice_references(voice: str | None, voices: VoiceStore | None,
                     aliases: Mapping[str, str] | None = None) -> tuple[Reference, ...]:
    """An OpenAI-style voice name -> the references it means. In order: no name or 'default' (the model's own
    voice); a configured alias (names in any case); a stored voice of that id; one of OpenAI's or Kokoro's names
    ('default', so clients' "alloy" and "af_bella" work); else an unknown voice (400, listing the stored ones)."""
    if voice is None or voice in DEFAULT_VOICES:
        return ()
    target = (aliases or {}).get(voice.lower())
    if target is not None:
        return () if target in DEFAULT_VOICES else _voice_reference(target, voices, alias=voice)
    stored = voices.get(voice) if voices is not None else None
    if stored is not None:
        return (Reference(text=stored.text, codes=stored.codes),)
    if voice.lower() in OPENAI_VOICES or KOKORO_VOICE.fullmatch(voice.lower()):
        return ()
    return _voice_reference(voice, voices)


def openai_job(body: dict | OpenAISpeechRequest, voices: VoiceStore | None, *,
               aliases: Mapping[str, str] | None = None, strict: bool = True) -> SpeechJob:
    """A body is validated here, once; a request already validated (validate) is taken as it is.
    aliases: voice name (lower case) -> stored voice id or 'default'. strict: see validate."""
    req = body if isinstance(body, OpenAISpeechRequest) else validate(OpenAISpeechRequest, body, strict)
    voice = req.voice.id if isinstance(req.voice, VoiceID) else req.voice
    refs = voice_references(voice, voices, aliases)
    synth = SynthesisRequest(text=req.input, references=refs, seed=req.seed, temperature=req.temperature,
                             top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                             max_new_tokens=req.max_new_tokens)
    check_output(req.response_format, req.sample_rate, req.speed)
    sse = req.stream_format == "sse"
    if sse and not req.stream:
        raise InputError("stream: false asks for one whole file; stream_format 'sse' is a stream of events")
    if sse and req.return_download_link:
        raise InputError("return_download_link keeps an audio file: use it with stream_format 'audio'")
    return SpeechJob(synth, req.response_format, req.sample_rate, req.speed, streaming=req.stream, sse=sse,
                     characters=len(req.input), volume=req.volume_multiplier,
                     download_link=req.return_download_link)


def _audio_bytes(value: bytes | str, where: str) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{where}: not valid base64") from None


def fish_job(body: dict | FishTTSRequest, voices: VoiceStore | None, *, strict: bool = True) -> SpeechJob:
    req = body if isinstance(body, FishTTSRequest) else validate(FishTTSRequest, body, strict)
    # a stored voice's id takes precedence over inline references, as upstream; "default" (what the "available"
    # list of an unknown voice names) is the model's own voice, as for OpenAI's `voice`: no stored voice then
    if req.reference_id and req.reference_id not in DEFAULT_VOICES:
        refs = _voice_reference(req.reference_id, voices)
    else:
        refs = tuple(Reference(text=r.text, audio=_audio_bytes(r.audio, f"references.{i}.audio"))
                     for i, r in enumerate(req.references))
    synth = SynthesisRequest(text=req.text, references=refs, seed=req.seed, temperature=req.temperature,
                             top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                             max_new_tokens=req.max_new_tokens,
                             # upstream declares 100..300 but ignores the field; clamp to what splitting supports
                             chunk_length=max(50, min(1000, req.chunk_length)))
    prosody = req.prosody or FishProsody()
    check_output(req.format, req.sample_rate, prosody.speed)
    return SpeechJob(synth, req.format, req.sample_rate, prosody.speed, streaming=req.streaming,
                     characters=len(req.text), volume=10 ** (prosody.volume / 20))


def job_from_body(body: dict, voices: VoiceStore | None, check_only: bool = False, *,
                  aliases: Mapping[str, str] | None = None, strict: bool = True) -> SpeechJob:
    """Either schema, told apart by its text field: `input` means OpenAI's fields, `text` fish-speech's.
    check_only validates without looking voices up (they may need a loaded model). aliases and strict as for
    openai_job (TTS_VOICE_ALIASES, TTS_STRICT_FIELDS); a tolerant reading lists what it dropped in job.ignored."""
    body = dict(body)
    if "input" in body:
        if check_only and body.get("voice") not in (None, *DEFAULT_VOICES):
            body["voice"] = None
        job, model = openai_job(body, voices, aliases=aliases, strict=strict), OpenAISpeechRequest
    elif "text" in body:
        if check_only:
            body.pop("reference_id", None)
        job, model = fish_job(body, voices, strict=strict), FishTTSRequest
    else:
        raise InputError("the body needs `text` (fish-speech /v1/tts fields) or `input` (OpenAI speech fields)")
    return dataclasses.replace(job, ignored=unknown_fields(model, body))


__all__ = ["FORMATS", "OPENAI_VOICES", "FishTTSRequest", "OpenAISpeechRequest", "ReferenceUpdate", "SpeechJob",
           "fish_job", "ignored_header", "job_from_body", "openai_job", "parse_body", "unknown_fields", "validate",
           "voice_references"]
