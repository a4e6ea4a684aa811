"""SageMaker's four functions over the engine. The same file works unchanged
(1) as `code/inference.py` in AWS's PyTorch inference containers (script mode),
(2) under the sagemaker-inference toolkit (Multi Model Server), and
(3) behind this image's `python -m handlers serve`.
It imports only `ttsengine` (copied beside it in script mode), never other handler modules.

Requests: application/json with the fields of /v1/tts (`text`, ...) or of OpenAI's speech API (`input`,
...), or application/x-msgpack. Responses by Accept: audio/wav, audio/mpeg, audio/ogg (opus),
audio/flac, audio/aac, audio/pcm, or application/json (base64 audio + metadata); */* gives the
format the request names.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ttsengine import (
    CONTENT_TYPES,
    EngineConfig,
    InputError,
    ServerConfig,
    SynthesisResult,
    TTSError,
    VoiceStore,
    check_output,
    encode_audio,
    from_env,
)
from ttsengine.serving.failure import failure
from ttsengine.serving.protocol import SpeechJob, job_from_body, parse_body
from ttsengine.serving.service import Service, engine_loader

ACCEPT = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3",
          "audio/ogg": "opus", "audio/opus": "opus", "audio/flac": "flac", "audio/aac": "aac", "audio/pcm": "pcm"}
JSON = "application/json"


class AcceptError(InputError):
    """The Accept header names a type this endpoint cannot produce (HTTP 406)."""

    status = 406


@dataclass
class Prediction:
    result: SynthesisResult
    job: SpeechJob


def _statuses(fn):
    """Under the sagemaker-inference toolkit (MMS, or AWS's PyTorch container, which vendors it) only
    GenericInferenceToolkitError carries a status; anything else becomes a 500. Translate ours there;
    elsewhere let them through (`serve` maps them itself)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TTSError as e:
            try:
                from sagemaker_inference.errors import GenericInferenceToolkitError
            except ImportError:
                raise e from None
            raise GenericInferenceToolkitError(http_status(e), str(e)) from e  # serve reads the cause's retry delay

    return wrapper


@_statuses
def model_fn(model_dir: str) -> Service:
    """Loads the model directory onto the GPU (CPU without one) and warms the engine up."""
    server = _settings()  # a bad TTS_VOICE_ALIASES / TTS_STRICT_FIELDS fails the load, not the first request
    service = service_for(from_env(model_dir=Path(model_dir))).load()
    service.settle(server.ready_when, server.ready_max_wait)  # the toolkit's /ping says 200 once model_fn returns
    return service


@_statuses
def input_fn(input_data: bytes | str, content_type: str | None) -> dict:
    """Parses and checks the body's shape; voices are resolved in predict_fn (they need the model)."""
    if isinstance(input_data, str):
        input_data = input_data.encode()
    body = parse_body(input_data, content_type)
    job_for(body, None, check_only=True)
    return body


@_statuses
def predict_fn(data: dict, model: Service) -> Prediction:
    job = job_for(data, model.voices)
    return Prediction(model.submit(job.request).result(), job)


@_statuses
def output_fn(prediction: Prediction, accept: str | None) -> tuple[bytes, str]:
    """-> (body, content type)."""
    job, result = prediction.job, prediction.result
    fmt, as_json = response_format(accept, job.format)
    audio = encode_audio(result.audio, result.sample_rate, fmt, job.sample_rate, job.speed)
    if not as_json:
        return audio.data, audio.content_type
    meta = metadata(result, audio.sample_rate, audio.seconds, fmt)
    if job.ignored:  # a tolerant reading dropped them; raw audio has no place to say so (script mode has no headers)
        meta["ignored_fields"] = list(job.ignored)
    return json.dumps({"audio": base64.b64encode(audio.data).decode(), "content_type": audio.content_type,
                       **meta}).encode(), JSON


# ---- shared pieces (serve uses them for streaming) ------------------------------------------------
def service_for(config: EngineConfig) -> Service:
    """The boot of model_fn (which loads it at once) and of `serve` (which loads it in the background): the
    configured engine, with voices stored beside the model when its directory is writable."""
    voices = config.model_dir / "voices" if _writable(config.model_dir) else None
    return Service(engine_loader(config), voices, config.features)


def job_for(body: dict, voices: VoiceStore | None, check_only: bool = False,
            server: ServerConfig | None = None) -> SpeechJob:
    """server: TTS_VOICE_ALIASES and TTS_STRICT_FIELDS (serve's, or read once by model_fn in script mode)."""
    server = server or _settings()
    body = {k: v for k, v in body.items() if k != "stream"}  # `serve`'s streaming switch, not a synthesis field
    speed = body.pop("speed", None) if "input" not in body else None  # fish-speech's schema has no speed
    job = job_from_body(body, voices, check_only, aliases=dict(server.voice_aliases), strict=server.strict_fields)
    if speed is None:
        return job
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise InputError(f"speed must be a number within 0.25..4.0, got {speed!r}")
    check_output(job.format, job.sample_rate, float(speed))
    return dataclasses.replace(job, speed=float(speed))


def response_format(accept: str | None, requested: str) -> tuple[str, bool]:
    """-> (audio format, wrap in JSON?) from the Accept header and the request's own format."""
    for item in (accept or "*/*").split(","):
        mime = item.split(";")[0].strip().lower()
        if mime in ACCEPT:
            return ACCEPT[mime], False
        if mime == JSON:
            return requested, True
        if mime in ("*/*", "audio/*", ""):
            return requested, False
    raise AcceptError(f"cannot produce {accept!r}; accepted: {', '.join([*sorted(set(ACCEPT)), JSON])}")


def metadata(result: SynthesisResult, rate: int, seconds: float, fmt: str) -> dict:
    return {"format": fmt, "sample_rate": rate, "seconds": round(seconds, 3), "seed": result.seed,
            "frames": result.frames, "chunks": [{"text": c.text, "frames": c.frames, "finish_reason": c.finish_reason}
                                                for c in result.chunks]}


def http_status(error: BaseException) -> int:
    """The status an error should produce (serve and the toolkit wrapper share it)."""
    if isinstance(getattr(error, "status_code", None), int):  # already a toolkit error
        return error.status_code
    return failure(error).status


def error_message(error: BaseException) -> str:
    return str(getattr(error, "message", None) or error)


def _writable(path: Path) -> bool:
    try:
        (path / "voices").mkdir(exist_ok=True)
        return True
    except OSError:
        return False


__all__ = ["CONTENT_TYPES", "Prediction", "input_fn", "model_fn", "output_fn", "predict_fn"]


@functools.cache
def _settings() -> ServerConfig:
    """Script mode's request-reading settings (TTS_VOICE_ALIASES, TTS_STRICT_FIELDS only: the HTTP server's
    other variables mean nothing here and must not fail the load), read from the environment once (the toolkit
    calls the four functions; there is no edge of ours to read them at)."""
    names = ("TTS_VOICE_ALIASES", "TTS_STRICT_FIELDS")
    return ServerConfig.from_env({k: os.environ[k] for k in names if k in os.environ})
