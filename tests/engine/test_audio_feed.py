"""Which generated frames go to the codec when (engine/audio_feed.py): pure table tests, no device."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine.engine.audio_feed import Task, chunk_sizes, codec_calls, ready_for_audio


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


@pytest.mark.parametrize("generated, decoded, ready", [(4, 0, False), (5, 0, True), (8, 4, False), (9, 4, True),
                                                      (16, 8, False), (17, 8, True), (36, 8, True), (40, 24, False),
                                                      (41, 24, True)])
def test_a_whole_chunk_of_kept_frames_is_ready(generated, decoded, ready):
    # the last generated frame may still be dropped: 5 generated = 4 kept = the first chunk (4); then chunks of at
    # most the audio made: after 4 a chunk of 4, after 8 one of 8, after 24 one of 16 (sizes 4, 8, 16, 32)
    assert (ready_for_audio([task(generated, decoded)], 4, 32) != []) is ready


def test_chunk_sizes_double_from_the_first_up_to_the_largest():
    assert chunk_sizes(4, 32) == (4, 8, 16, 32)
    assert chunk_sizes(4, 8) == (4, 8)
    assert chunk_sizes(4, 20) == (4, 8, 16, 20)
    assert chunk_sizes(8, 4) == (8, 4)  # no growth when later chunks are smaller: first, then stream


def test_a_long_stream_grows_its_chunks_and_never_pads_one_while_running():
    # one stream generating frame by frame, audio taken whenever ready: chunks 4, 4, 8, 16, 32, 32 ..., each at most
    # the audio already made (so a listener never waits at any speed above real time), none padded before the end
    t, taken = task(0), []
    for generated in range(1, 200):
        t.frames = [np.zeros(5, np.int64)] * generated
        if ready_for_audio([t], 4, 32):
            for count, _ in codec_calls([t], False, 4, 32):
                assert count in chunk_sizes(4, 32) and count <= max(4, t.decoded)
                taken.append(count)
                t.decoded += count
    assert taken == [4, 4, 8, 16, 32, 32, 32, 32, 32]


def test_running_calls_take_whole_chunks_grouped_by_length():
    tasks = [task(5), task(13, 4), task(21, 4)]  # kept 4 / 12 / 20
    assert calls(tasks, final=False) == [(4, [0]), (8, [1, 2]), (8, [2])]
    assert [t.decoded for t in tasks] == [4, 12, 20]


def test_final_calls_take_everything_left_in_pieces_of_the_largest_chunk():
    tasks = [task(3), task(21, 4)]  # kept 2 / 20
    assert calls(tasks, final=True) == [(2, [0]), (8, [1]), (8, [1])]
    assert [t.decoded for t in tasks] == [2, 20]
