"""Which generated frames go to the codec when (engine/audio_feed.py): pure table tests, no device."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine.engine.audio_feed import Task, codec_calls, ready_for_audio


def task(generated: int, decoded: int = 0) -> Task:
    t = Task(stream=None, plan=None, index=0, prompt=None, context_dropped=False, frame_offset=0)
    t.frames = [np.zeros(5, np.int64)] * generated
    t.decoded = decoded
    return t


def calls(tasks, final, first=4, stream=8):
    out = []
    for count, group in codec_calls(tasks, final, first, stream):
        out.append((count, [tasks.index(t) for t in group]))
        for t in group:
            t.decoded += count
    return out


@pytest.mark.parametrize("generated, decoded, ready", [(4, 0, False), (5, 0, True), (12, 4, False), (13, 4, True)])
def test_a_whole_chunk_of_kept_frames_is_ready(generated, decoded, ready):
    # the last generated frame may still be dropped: 5 generated = 4 kept = the first chunk (4)
    assert (ready_for_audio([task(generated, decoded)], 4, 8) != []) is ready


def test_running_calls_take_whole_chunks_grouped_by_length():
    tasks = [task(5), task(13, 4), task(21, 4)]  # kept 4 / 12 / 20
    assert calls(tasks, final=False) == [(4, [0]), (8, [1, 2]), (8, [2])]
    assert [t.decoded for t in tasks] == [4, 12, 20]


def test_final_calls_take_everything_left_in_pieces_of_the_largest_chunk():
    tasks = [task(3), task(21, 4)]  # kept 2 / 20
    assert calls(tasks, final=True) == [(2, [0]), (8, [1]), (8, [1])]
    assert [t.decoded for t in tasks] == [2, 20]
