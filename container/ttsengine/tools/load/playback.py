"""Stalls as a listener hears them: playback starts with the first audio and plays each piece as it arrives;
a stall is the audio running dry after that (the same account as Stream.stalls in the engine)."""

from __future__ import annotations

from collections.abc import Iterator

GAP_S = 0.001  # shorter waits are counted in the seconds but not as a stall


def _waits(pieces: list[tuple[float, float]]) -> Iterator[tuple[int, float]]:
    """(index, seconds the listener waited for it) for each piece that came after the audio so far had played."""
    until = None  # when the audio arrived so far has played out
    for i, (at, seconds) in enumerate(pieces):
        if until is not None and at > until:
            yield i, at - until
        start = at if until is None else max(at, until)
        until = start + seconds


def stalls(pieces: list[tuple[float, float]]) -> tuple[int, float]:
    """pieces: (arrival time, audio seconds) in order -> (stalls, seconds waited after playback started)."""
    waits = [w for _, w in _waits(pieces)]
    return sum(w >= GAP_S for w in waits), sum(waits)


def first_stall(pieces: list[tuple[float, float]]) -> int | None:
    """The index of the first piece the listener waited for (a stall), None when the audio never ran dry."""
    return next((i for i, w in _waits(pieces) if w >= GAP_S), None)
