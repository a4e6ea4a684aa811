"""Stalls as a listener hears them: playback starts with the first audio and plays each piece as it arrives;
a stall is the audio running dry after that (the same account as Stream.stalls in the engine)."""

from __future__ import annotations

GAP_S = 0.001  # shorter waits are counted in the seconds but not as a stall


def stalls(pieces: list[tuple[float, float]]) -> tuple[int, float]:
    """pieces: (arrival time, audio seconds) in order -> (stalls, seconds waited after playback started)."""
    count, waited, until = 0, 0.0, None  # until: when the audio arrived so far has played out
    for at, seconds in pieces:
        if until is not None and at > until:
            waited += at - until
            count += at - until >= GAP_S
        start = at if until is None else max(at, until)
        until = start + seconds
    return count, waited
