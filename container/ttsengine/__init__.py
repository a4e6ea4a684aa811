"""ttsengine: our inference engine for Fish-Speech / OpenAudio S1-mini.

The public API adapters use: EngineConfig / from_env, Engine, SynthesisRequest, Reference, the errors.
"""

from .config import EngineConfig, from_env
from .engine.engine import AudioChunk, Engine, Synthesis, SynthesisResult
from .engine.request import Reference, SynthesisRequest
from .errors import (
    BusyError,
    CancelledError,
    CheckpointError,
    ConfigError,
    DownloadError,
    InputError,
    TTSError,
)

__all__ = [
    "AudioChunk", "BusyError", "CancelledError", "CheckpointError", "ConfigError", "DownloadError", "Engine",
    "EngineConfig", "InputError", "Reference", "Synthesis", "SynthesisRequest", "SynthesisResult", "TTSError",
    "from_env",
]
