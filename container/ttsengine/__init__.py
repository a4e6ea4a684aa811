"""ttsengine: our inference engine for Fish-Speech / OpenAudio S1-mini.

The public API adapters use: EngineConfig / from_env, Engine, Fleet (one engine per device), SynthesisRequest,
Reference, the errors.
"""

from .audio.encode import CONTENT_TYPES, FORMATS, AudioEncoder, EncodedAudio, check_output, encode_audio, output_rate
from .config import DownloadConfig, EngineConfig, RunPodConfig, SageMakerConfig, ServerConfig, from_env
from .eager import EagerEngine
from .engine.engine import Engine
from .engine.fleet import Fleet
from .engine.stats import EngineStats, FleetStats
from .errors import (
    AtCapacity,
    BusyError,
    CancelledError,
    CheckpointError,
    ConfigError,
    DownloadError,
    EngineDown,
    InputError,
    MediaTypeError,
    NoAudio,
    ShuttingDown,
    TTSError,
)
from .serving.delivery import audio_bytes, audio_record, sse_events, whole
from .serving.download import ensure_model, model_origin
from .serving.voices import Voice, VoiceStore, check_id
from .synthesis.captions import cues as caption_cues
from .synthesis.captions import render as render_captions
from .synthesis.output import AudioChunk, SynthesisResult
from .synthesis.plan import ChunkReport
from .synthesis.request import Reference, SynthesisRequest
from .synthesis.stream import Stream

__all__ = [
    "AtCapacity", "AudioChunk", "AudioEncoder", "BusyError", "CONTENT_TYPES", "CancelledError", "CheckpointError",
    "ChunkReport",
    "ConfigError", "DownloadConfig", "DownloadError", "EncodedAudio", "Engine", "EngineConfig", "EngineDown",
    "EngineStats", "FORMATS", "Fleet", "FleetStats",
    "InputError", "MediaTypeError", "Reference", "EagerEngine", "RunPodConfig", "SageMakerConfig", "ServerConfig",
    "NoAudio", "ShuttingDown",
    "Stream", "SynthesisRequest", "SynthesisResult", "TTSError", "Voice", "VoiceStore", "audio_bytes", "audio_record",
    "caption_cues", "check_id", "check_output", "encode_audio", "ensure_model", "from_env", "model_origin",
    "output_rate", "render_captions", "sse_events", "whole",
]
