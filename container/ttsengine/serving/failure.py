"""What an error means to a client, whatever the transport: one table from the error's class to a kind
(the client can fix it, should retry it, or neither) and when to retry, with the status the error carries
(errors.py: every TTSError subclass names its own). Anything else is a bug: 500, its text kept from the client.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BusyError, EngineDown, InputError, ShuttingDown, TTSError, scrub


class ModelLoading(BusyError):
    """The engine is still loading or warming up (503)."""


class ModelFailed(TTSError):
    """The engine failed to load; requests fail until the process restarts."""

    status = 503


@dataclass(frozen=True)
class Failure:
    status: int
    kind: str  # "input": the client can fix the request | "busy": retry later | "server": neither
    message: str  # one line, safe to show
    retry_after: int | None = None  # seconds, for a Retry-After header
    expected: bool = True  # False: not one of our errors (a bug); log it with its traceback


# The first match wins, so a subclass comes before its base. Loading and compiling take a while; a busy
# engine frees a slot within about a second under load.
TABLE: tuple[tuple[type[TTSError], str, int | None], ...] = (
    (InputError, "input", None),
    (ModelLoading, "busy", 5),
    (BusyError, "busy", 1),
    (EngineDown, "busy", 1),  # another engine takes the retry (or none: the health check says so)
    (ShuttingDown, "busy", 5),  # this instance is going away: a load balancer sends the retry elsewhere
    (TTSError, "server", None),
)


def failure(error: BaseException) -> Failure:
    for cls, kind, retry_after in TABLE:
        if isinstance(error, cls):
            return Failure(error.status, kind, scrub(str(error)), retry_after)
    return Failure(500, "server", "internal server error", expected=False)
