"""Captions from the text chunks: which chunk of the text produced which stretch of the audio, exactly (each
chunk's kept frames times the codec's samples per frame), as SRT or WebVTT cues. One cue per text chunk (a few
sentences, up to chunk_length characters); finer timing would be a guess, so there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import ChunkReport

FORMATS = ("srt", "vtt")


@dataclass(frozen=True)
class Cue:
    start: float  # seconds
    end: float
    text: str


def cues(reports: tuple[ChunkReport, ...] | list[ChunkReport], seconds_per_frame: float) -> list[Cue]:
    """One cue per text chunk that made audio, back to back from 0."""
    out, frames = [], 0
    for r in reports:
        if r.frames:
            out.append(Cue(frames * seconds_per_frame, (frames + r.frames) * seconds_per_frame, r.text.strip()))
        frames += r.frames
    return out


def timestamp(seconds: float, decimal: str) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{decimal}{ms % 1000:03d}"


def render(cue_list: list[Cue], fmt: str) -> str:
    """The cues as an SRT (fmt "srt") or WebVTT ("vtt") file."""
    if fmt not in FORMATS:
        raise ValueError(f"captions format {fmt!r}: use srt or vtt")
    blocks = []
    for i, c in enumerate(cue_list, 1):
        sep = "," if fmt == "srt" else "."
        times = f"{timestamp(c.start, sep)} --> {timestamp(c.end, sep)}"
        blocks.append(f"{i}\n{times}\n{c.text}\n" if fmt == "srt" else f"{times}\n{c.text}\n")
    head = "WEBVTT\n\n" if fmt == "vtt" else ""
    return head + "\n".join(blocks)
