"""Which generated frames go to the codec when (engine/audio_feed.py): pure table tests, no device."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine.engine.audio_feed import (
    CodecRounds,
    Task,
    buffered_seconds,
    chunk_sizes,
    codec_calls,
    final_calls,
    pending_codes,
    ready_for_audio,
)
from ttsengine.synthesis.stream import Stream

FRAME_S = 2048 / 44100


def task(generated: int, decoded: int = 0, slot: int = 0) -> Task:
    t = Task(stream=Stream(None, 44100), plan=None, index=0, prompt=None, context_dropped=False, frame_offset=0,
             voc_slot=slot)
    t.frames = [np.zeros(5, np.int64)] * generated
    t.decoded = decoded
    return t


def calls(tasks, first=4, stream=8):
    out = []
    for count, group in codec_calls(tasks, first, stream):
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
            for count, _ in codec_calls([t], 4, 32):
                assert count in chunk_sizes(4, 32) and count <= max(4, t.decoded)
                taken.append(count)
                t.decoded += count
    assert taken == [4, 4, 8, 16, 32, 32, 32, 32, 32]


def test_running_calls_take_whole_chunks_grouped_by_length():
    tasks = [task(5), task(13, 4), task(21, 4)]  # kept 4 / 12 / 20
    assert calls(tasks) == [(4, [0]), (8, [1, 2]), (8, [2])]
    assert [t.decoded for t in tasks] == [4, 12, 20]


def test_final_calls_take_everything_left_in_pieces_of_the_largest_chunk_every_task_in_each():
    tasks = [task(3), task(21, 4), task(1), task(9, 8)]  # left: 2 / 16 / 0 (kept 0) / 0 (kept 8, decoded 8)
    out = []
    for call in final_calls(tasks, 8):
        out.append([(tasks.index(t), n) for t, n in call])
        for t, n in call:
            t.decoded += n
    assert out == [[(0, 2), (1, 8)], [(1, 8)]]  # one call per round, not one per length
    assert [t.decoded for t in tasks] == [2, 20, 0, 8]


def test_pending_codes_drop_the_text_slot_and_pad_to_the_call():
    t = task(0, 1)
    t.frames = [np.arange(5, dtype=np.int64) + 10 * i for i in range(4)]  # frame i: [10i, 10i+1, ..., 10i+4]
    codes = pending_codes(t, 2, 4)  # frames 1 and 2, padded to 4 columns
    assert codes.shape == (4, 4) and codes.dtype == np.int64
    assert codes[:, :2].tolist() == [[11, 21], [12, 22], [13, 23], [14, 24]] and not codes[:, 2:].any()
    assert pending_codes(t, 3, 3).shape == (4, 3)


def test_buffered_audio_is_made_less_played():
    t = task(30, 12)
    assert buffered_seconds(t, 5.0, FRAME_S) is None  # its first chunk has not arrived
    t.stream.first_audio_at = 4.5
    assert buffered_seconds(t, 5.0, FRAME_S) == pytest.approx(12 * FRAME_S - 0.5)
    t.audio_offset, t.frame_offset = 20, 22  # earlier text chunks' audio plays first (their dropped frames do not)
    assert buffered_seconds(t, 5.0, FRAME_S) == pytest.approx(32 * FRAME_S - 0.5)


def test_between_rounds_only_first_chunks_and_short_buffers_go():
    rounds = CodecRounds(4, 8, FRAME_S)
    first, held, short, unplayed = task(5), task(30, 16), task(30, 16), task(30, 16)
    held.stream.first_audio_at = 0.0  # 16 frames made (0.74 s), 0.08 s played
    short.stream.first_audio_at = -0.7  # 0.71 s played: 0.03 s left
    tasks = [first, held, short, unplayed]  # unplayed: its first chunk not arrived yet
    for i in range(1, 8):
        assert rounds.due(tasks, 0.01 * i) == [first, short, unplayed], i
    assert rounds.due(tasks, 0.08) == tasks  # the 8th iteration is a round: everything ready goes
    assert rounds.pace == pytest.approx(0.01)


def test_the_hold_scales_with_the_pace_and_off_holds_nothing():
    def held_at(pace):
        t = task(30, 16)  # 0.74 s of audio made, 0.15 s of it played at the second call
        t.stream.first_audio_at = 0.9
        rounds = CodecRounds(4, 8, FRAME_S)
        rounds.due([t], 1.05 - pace)
        return rounds.due([t], 1.05) == []
    assert held_at(0.01)  # a round is 0.08 s away: 0.59 s buffered is plenty
    assert not held_at(0.05)  # two rounds of 0.05 s steps + the margin: 0.9 s > 0.59 s, so it goes now
    t = task(30, 16)
    t.stream.first_audio_at = 0.0
    off = CodecRounds(4, 8, FRAME_S, enabled=False)
    assert all(off.due([t], 0.01 * i) == [t] for i in range(1, 8))


def test_idle_restarts_the_pace():
    rounds = CodecRounds(4, 8, FRAME_S)
    t = task(30, 16)
    rounds.due([t], 0.0)
    rounds.due([t], 0.01)
    assert rounds.due([], 30.0) == [] and rounds.due([t], 31.0) is not None
    assert rounds.pace == pytest.approx(0.01)  # the 30 s idle gap is not an iteration


def simulate(streams: int, pace: float, enabled: bool, iterations: int = 240, per_call: list | None = None):
    """Streams (codec slots 0, 1, ...) starting in cohorts of 1/8 over 8 iterations, one frame each per iteration
    (`pace` seconds), audio sent when due and heard from its first chunk on -> (codec calls (frames, rows) made while
    running, the least audio any listener held); per_call: gets each iteration's rows sent."""
    rounds, tasks, calls_made, least = CodecRounds(4, 8, FRAME_S, enabled), [], [], float("inf")
    for i in range(iterations):
        now = i * pace
        if i < 8:
            tasks += [task(0, slot=len(tasks) + k) for k in range(streams // 8)]
        for t in tasks:
            t.frames.append(np.zeros(5, np.int64))
        for t in tasks:
            buffered = buffered_seconds(t, now, FRAME_S)
            if buffered is not None:
                least = min(least, buffered)
        due = rounds.due(tasks, now)
        if per_call is not None:
            per_call.append(len(due))
        for count, group in codec_calls(due, 4, 8):
            assert count in (4, 8)
            calls_made.append((count, len(group)))
            for t in group:
                t.decoded += count
                if t.stream.first_audio_at is None:
                    t.stream.first_audio_at = now
    return calls_made, least


def test_rounds_join_the_streams_into_few_large_calls_and_no_listener_runs_dry():
    # 64 streams at 8 ms a step (~5.8x real time): without rounds each step sends the cohort at a chunk boundary
    calls_off, least_off = simulate(64, 0.008, enabled=False)
    calls_on, least_on = simulate(64, 0.008, enabled=True)
    assert sum(f * r for f, r in calls_on) == sum(f * r for f, r in calls_off)  # the same audio
    assert len(calls_on) * 3 < len(calls_off)
    late = calls_on[len(calls_on) // 2:]  # past the start every call holds most streams
    assert min(r for _, r in late) >= 48, late
    assert least_on >= 0 and least_off >= 0


def test_near_real_time_rounds_hold_back_no_one():
    # 40 ms a step (1.16x real time): buffers stay thin, so chunks go as they are ready, as without rounds
    calls_on, least_on = simulate(64, 0.040, enabled=True, iterations=120)
    calls_off, least_off = simulate(64, 0.040, enabled=False, iterations=120)
    assert calls_on == calls_off and least_on == least_off


def test_more_streams_than_a_graph_spread_over_the_phases():
    # 128 streams, steps fast enough that listeners hold plenty: slots 0-63 share a phase, 64-127 the next: past the
    # start the codec gets one graph's worth of rows at two iterations of every eight
    rows = []
    simulate(128, 0.004, enabled=True, iterations=200, per_call=rows)
    late = rows[104:200]
    assert sorted(set(late)) == [0, 64] and sum(late) == 128 * len(late) // 8, late
    t = task(30, 16, slot=64 + 5)
    t.stream.first_audio_at = 0.0
    rounds = CodecRounds(4, 8, FRAME_S)
    sent = [i for i in range(1, 17) if rounds.due([t], 0.001 * i)]
    assert sent == [7, 15]  # its phase: iterations i with (i + 1) % 8 == 0


def test_past_two_phases_of_streams_nothing_waits():
    # 512 streams: the codec thread is behind and merges queued calls itself; rounds would hold chunks for nothing
    assert simulate(512, 0.004, enabled=True, iterations=100) == simulate(512, 0.004, enabled=False, iterations=100)


def test_a_later_text_chunks_first_audio_never_waits_and_a_reset_forgets_the_pace():
    rounds = CodecRounds(4, 8, FRAME_S)
    later = task(5)  # its first chunk, while the stream's listener holds 2 s of earlier text chunks' audio
    later.audio_offset = 60
    later.stream.first_audio_at = 0.5
    held = task(30, 16)  # 0.74 s made, ~0.1 s played
    held.stream.first_audio_at = 0.9
    for i in range(1, 8):
        assert rounds.due([later, held], 1.0 + 0.01 * i) == [later], i
    rounds.reset()
    assert rounds.pace == 0.0 and rounds.due([held], 100.0) == [held] and rounds.pace == 0.0  # a round, no gap


def test_rounds_come_every_first_chunk_when_later_chunks_are_smaller():
    rounds = CodecRounds(8, 4, FRAME_S)  # first 8, later 4: a round every 8 iterations
    t = task(30, 8)
    t.stream.first_audio_at = 0.0
    assert [i for i in range(1, 17) if rounds.due([t], 0.001 * i)] == [8, 16]


def test_a_stream_plays_once_frames_of_it_went_to_the_codec_in_this_text_chunk_or_an_earlier_one():
    assert not task(generated=3).playing  # frames made, none sent to the codec yet
    assert task(generated=5, decoded=4).playing
    later = task(generated=0)
    later.audio_offset = 40  # the stream's earlier text chunks made audio
    assert later.playing
