"""ttsengine: our inference engine for Fish-Speech / OpenAudio S1-mini.

The public API adapters use: EngineConfig / from_env, Engine, Fleet (one engine per device), SynthesisRequest,
Reference, the errors.

Each name is imported at its first use (PEP 562), not with the package: `import ttsengine.config` (or any light
module) then costs no torch import, so an entry point can start reading the weights from disk before torch and the
web framework are imported (model/loading/readahead.py `ahead_of_imports`).
"""

from __future__ import annotations

import importlib

_FROM = {  # public name -> (module, its name there)
    **{n: (".audio.encode", n) for n in ("CONTENT_TYPES", "FORMATS", "AudioEncoder", "EncodedAudio", "check_output",
                                         "encode_audio", "output_rate")},
    **{n: (".config", n) for n in ("DownloadConfig", "EngineConfig", "RunPodConfig", "SageMakerConfig",
                                   "ServerConfig", "from_env")},
    "EagerEngine": (".eager", "EagerEngine"),
    "Engine": (".engine.engine", "Engine"),
    "Fleet": (".engine.fleet", "Fleet"),
    **{n: (".engine.stats", n) for n in ("EngineStats", "FleetStats")},
    **{n: (".errors", n) for n in ("AtCapacity", "BusyError", "CancelledError", "CheckpointError", "ConfigError",
                                   "DownloadError", "EngineDown", "InputError", "MediaTypeError", "NoAudio",
                                   "ShuttingDown", "TTSError")},
    **{n: (".serving.delivery", n) for n in ("audio_bytes", "audio_record", "sse_events", "whole")},
    **{n: (".serving.download", n) for n in ("ensure_model", "model_origin")},
    **{n: (".serving.prefetch", n) for n in ("build_kernels_ahead", "read_weights_ahead")},
    **{n: (".serving.voices", n) for n in ("Voice", "VoiceStore", "check_id")},
    "caption_cues": (".synthesis.captions", "cues"),
    "render_captions": (".synthesis.captions", "render"),
    **{n: (".synthesis.output", n) for n in ("AudioChunk", "SynthesisResult")},
    "ChunkReport": (".synthesis.plan", "ChunkReport"),
    **{n: (".synthesis.request", n) for n in ("Reference", "SynthesisRequest")},
    "Stream": (".synthesis.stream", "Stream"),
}

__all__ = sorted(_FROM)


def __getattr__(name: str):
    try:
        module, attr = _FROM[name]
    except KeyError:
        raise AttributeError(f"module 'ttsengine' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM))
