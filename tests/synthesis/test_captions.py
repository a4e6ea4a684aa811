"""Captions from chunk reports: back-to-back cues from exact frame counts, SRT and WebVTT text."""

from __future__ import annotations

import pytest

from ttsengine.synthesis.captions import Cue, cues, render, timestamp
from ttsengine.synthesis.plan import ChunkReport


def report(text: str, frames: int) -> ChunkReport:
    return ChunkReport(text, frames, "stop", False, 10)


def test_cues_follow_the_frames_and_skip_silent_chunks():
    hop = 2048 / 44100
    got = cues([report(" One. ", 10), report("Nothing.", 0), report("Two.", 5)], hop)
    assert got == [Cue(0.0, 10 * hop, "One."), Cue(10 * hop, 15 * hop, "Two.")]


def test_timestamps_and_formats():
    assert timestamp(3723.4567, ",") == "01:02:03,457" and timestamp(0.0004, ".") == "00:00:00.000"
    two = [Cue(0.0, 1.5, "A."), Cue(1.5, 62.25, "B.")]
    assert render(two, "srt") == "1\n00:00:00,000 --> 00:00:01,500\nA.\n\n2\n00:00:01,500 --> 00:01:02,250\nB.\n"
    assert render(two, "vtt") == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nA.\n\n"
                                  "00:00:01.500 --> 00:01:02.250\nB.\n")
    with pytest.raises(ValueError, match="use srt or vtt"):
        render(two, "ass")
