"""Stream.stalls: how long a listener playing from the first chunk on waits for audio (the bench's stall figures)."""

import numpy as np
import pytest

from ttsengine.synthesis.stream import Stream


def stream_with(arrivals, rate=100):
    s = Stream(None, rate)
    for _, samples in arrivals:
        s.emit(np.zeros(samples, np.float32), 0)
    s.arrivals = [(at, samples) for at, samples in arrivals]  # the test's clock, not the emit time
    return s


def test_a_stream_ahead_of_playback_never_stalls():
    # 1 s of audio at t=0, the next second at 0.9 s, 0.5 s at 1.95 s: always there before it is needed
    assert stream_with([(0.0, 100), (0.9, 100), (1.95, 50)]).stalls() == 0.0
    assert Stream(None, 100).stalls() == 0.0  # no audio at all


def test_gaps_add_up_and_playback_resumes_from_the_late_chunk():
    # 0.5 s at 0, the next at 0.7 (0.2 s late) playing until 1.2, the next at 1.5 (0.3 s late)
    assert stream_with([(0.0, 50), (0.7, 50), (1.5, 50)]).stalls() == pytest.approx(0.5)


def test_emit_records_each_chunks_arrival():
    s = Stream(None, 44100)
    s.emit(np.zeros(2048 * 4, np.float32), 0)
    s.emit(np.zeros(2048 * 8, np.float32), 0)
    assert [n for _, n in s.arrivals] == [8192, 16384] and s.arrivals[0][0] == s.first_audio_at


def test_relay_hands_over_what_was_queued_and_says_so():
    # the engine process's forwarding (serving/engine_process/host.py): the vocoder shares one audio block among
    # relayed streams' chunks (Stream.relayed), so a relay must take every chunk, queued ones first, in order
    s = Stream(None, 100)
    s.emit(np.ones(3, np.float32), 0)
    assert not s.relayed
    got = []
    s.relay(got.append)
    s.emit(np.full(2, 2.0, np.float32), 0)
    s.finish()
    assert s.relayed and [len(c.audio) for c in got[:2]] == [3, 2] and len(got) == 3  # two chunks, then the end
