"""ttsengine: our inference engine for Fish-Speech / OpenAudio S1-mini.

The public API adapters use: EngineConfig / from_env, Engine, SynthesisRequest, Reference, the errors.
"""

from .config import EngineConfig, from_env
from .engine.engine import Engine
from .engine.output import AudioChunk, SynthesisResult
from .engine.plan import ChunkReport
from .engine.reference import ReferenceEngine
from .engine.request import Reference, SynthesisRequest
from .engine.stream import Stream
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
    "AudioChunk", "BusyError", "CancelledError", "CheckpointError", "ChunkReport", "ConfigError", "DownloadError",
    "Engine", "EngineConfig", "InputError", "Reference", "ReferenceEngine", "Stream", "SynthesisRequest",
    "SynthesisResult", "TTSError", "from_env",
]
