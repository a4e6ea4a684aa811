"""Error types the core raises. Each carries the HTTP-like `status` adapters answer with (InputError -> 4xx).

Every message is one line that says what is wrong and where, so it can be shown to a user as is.
"""

from __future__ import annotations


class TTSError(Exception):
    """Base class of every error the engine raises on purpose."""

    status = 500


class InputError(TTSError, ValueError):
    """The request is invalid (bad text, parameter out of range, unreadable reference audio)."""

    status = 400


class MediaTypeError(InputError):
    """The request body's content type is not one the endpoint reads (HTTP 415)."""

    status = 415


class CheckpointError(TTSError):
    """A model directory or file cannot be used (missing, corrupt, wrong keys or shapes)."""


class ConfigError(CheckpointError):
    """A config file has unknown or missing keys, or values that cannot describe a model."""


class BusyError(TTSError):
    """The engine has no free slot and its queue is full; the caller should retry later."""

    status = 503


class EngineDown(TTSError):
    """The engine (one GPU's) failed and was taken out of service; another engine, or a restart, serves."""

    status = 503


class ShuttingDown(TTSError):
    """The server is draining or stopped (SIGTERM): new work goes to another instance; cut work says so."""

    status = 503


class CancelledError(TTSError):
    """The request was cancelled before it finished."""


class DownloadError(TTSError):
    """Fetching a model failed (credentials, missing repository or object, network)."""
