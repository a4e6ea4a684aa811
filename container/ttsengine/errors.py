"""Error types the core raises. Each carries the HTTP-like `status` adapters answer with (InputError -> 4xx).

Every message is one line that says what is wrong and where, so it can be shown to a user as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# "<_io.BytesIO object at 0x7f...>", "<function f at 0x...>": a library's repr of one of its objects
_REPR = re.compile(r"<[^<>]*\bat 0x[0-9a-fA-F]+>")


class TTSError(Exception):
    """Base class of every error the engine raises on purpose."""

    status = 500


class InputError(TTSError, ValueError):
    """The request is invalid (bad text, parameter out of range, unreadable reference audio)."""

    status = 400


class MediaTypeError(InputError):
    """The request body's content type is not one the endpoint reads (HTTP 415)."""

    status = 415


class NoAudio(InputError):
    """The generation ended without a single frame of audio (the model stopped at once, or max_new_tokens
    left no room): an empty 200 would look like success, so the request fails (HTTP 422)."""

    status = 422


def no_audio() -> NoAudio:
    return NoAudio("the model produced no audio for this text (it ended at once): text with words to speak, "
                   "another seed, or max_new_tokens of 2 or more gives audio")


class CheckpointError(TTSError):
    """A model directory or file cannot be used (missing, corrupt, wrong keys or shapes)."""


class ConfigError(CheckpointError):
    """A config file has unknown or missing keys, or values that cannot describe a model."""


class BusyError(TTSError):
    """The engine has no free slot and its queue is full; the caller should retry later."""

    status = 503


class AtCapacity(BusyError):
    """Goodput admission (TTS_ADMIT_RTF) refused a new stream: with it the streams would fall below real time. A
    caller that can wait for room (RunPod's worker, whose jobs would otherwise fail) tries again shortly."""


class EngineDown(TTSError):
    """The engine (one GPU's) failed and was taken out of service; another engine, or a restart, serves."""

    status = 503


class ShuttingDown(TTSError):
    """The server is draining or stopped (SIGTERM): new work goes to another instance; cut work says so."""

    status = 503


class CancelledError(TTSError):
    """The request was cancelled before it finished."""


class Abandoned(CancelledError):
    """The client left: its request was given up (its planning dropped or stopped before the next reference, its
    generation cancelled). Nobody reads the answer; 499 is what the access log and the metrics count."""

    status = 499

    @classmethod
    def check(cls, abandoned: Callable[[], bool] | None) -> None:
        """Between units of planning work: raises if the request's client has left (abandoned() is True)."""
        if abandoned is not None and abandoned():
            raise cls("the client left before the request was taken in")


class DownloadError(TTSError):
    """Fetching a model failed (credentials, missing repository or object, network)."""


# An engine's failure reaches clients as these words only: its own text ("RuntimeError: CUDA error: an illegal
# memory access ...") tells them nothing they can act on and says how the server is built; it stays in the server
# log (logged once, with its traceback, where it happened) and in the engine's stats.
SEE_LOGS = "see the server logs"


def engine_failed(device: str) -> str:
    """The one public line for an engine that failed or was taken out of service."""
    return f"the engine on {device} failed; {SEE_LOGS}"


def scrub(message: str) -> str:
    """A message without object reprs (their heap addresses help an attacker and mean nothing to a user)."""
    return _REPR.sub("the data", message)
