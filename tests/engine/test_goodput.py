"""Goodput admission's rule (engine/control/goodput.py, issue 50) as a table: which stream counts it refuses from
measured step times per bucket and the codec's lag, and the room it reports to the router. Pure Python."""

from __future__ import annotations

import random

import pytest

from ttsengine.engine.control.goodput import FRESH_S, LAG_CHUNKS, Goodput

FRAME = 1 / 21.5  # seconds of audio per frame
BUDGET = FRAME / 1.2  # the step that keeps each stream at 1.2x real time: 38.8 ms
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


def gate(steps: dict[int, float], rtf: float = 1.2, lag: float = 0.0) -> Goodput:
    return Goodput(rtf, FRAME, bucket, steps, lambda: lag, chunk_frames=8)


def test_nothing_measured_or_off_refuses_nothing():
    assert gate({}).refuses(256, 0) is None
    assert gate({256: 1.0}, rtf=0).refuses(256, 200) is None  # TTS_ADMIT_RTF=0
    assert gate({256: 1.0}, rtf=0, lag=100.0).refuses(256, 200) is None


@pytest.mark.parametrize("steps, streams, refused", [
    ({64: 0.020}, 64, False),  # timed, under the budget
    ({64: 0.040}, 64, True),  # timed, over it
    ({64: 0.040}, 33, True),  # 33 streams run in bucket 64
    ({32: 0.015, 128: 0.045}, 64, True),  # untimed 64: the nearest timed bucket above (45 ms) bounds it
    ({32: 0.015, 128: 0.030}, 64, False),
    ({128: 0.025}, 256, True),  # beyond the largest, within 2x: scaled, 25 x 256 / 128 = 50 ms: over
    ({128: 0.018}, 256, False),  # 36 ms: under
    ({128: 0.020}, 256, True),  # 40 ms: over
    ({4: 0.010}, 256, False),  # 64x the largest timed bucket: its 2x (20 ms) stands, the slots decide
    ({4: 0.020}, 256, True),  # ... and refuses when that is over the budget already (as at 8 streams)
    ({4: 0.050}, 256, True),  # but a smaller bucket already slower than the budget is a floor
])
def test_the_step_rule(steps, streams, refused):
    why = gate(steps).refuses(streams, running=streams - 1)
    assert (why is not None) == refused, why
    if why:
        assert f"a step for {streams} streams would take" in why and "38.8 ms that keep each at 1.2x real time" in why


def test_the_codec_lag_rule():
    lasts = LAG_CHUNKS * 8 * FRAME / 1.2  # chunks of 8 frames (372 ms each) at 1.2x real time: 3 in 930 ms
    assert gate({}, lag=lasts - 0.01).refuses(11, 10) is None
    assert gate({}, lag=lasts - 0.01).refuses(256, 2) is None  # however many frames wait: only their age counts
    why = gate({}, lag=1.5).refuses(11, 10)
    assert why == "the codec is 1.50 s behind: a chunk of audio has waited longer than 3 chunks last at 1.2x real " \
                  "time (930 ms)"
    assert gate({}, lag=100.0).refuses(1, 0) is None  # nothing running: nothing to protect


def test_room_is_the_largest_count_admitted():
    g = gate({16: 0.010, 32: 0.030, 64: 0.045})  # 33..64 streams would be too slow
    assert g.room(20, 20, 256) == 12  # up to 32 in all
    assert g.room(40, 40, 256) == 0
    assert gate({64: 0.010}).room(10, 10, 64) == 54  # every free slot
    assert gate({64: 0.010}, rtf=0).room(10, 10, 64) == 54
    assert gate({}, lag=1.0).room(10, 10, 64) == 0  # the codec is behind: nothing


def test_a_smaller_bucket_timed_slower_is_a_floor_everywhere():
    # noisy timings invert buckets: 64 timed at 40 ms and 128 at 38 ms must not let 65-128 streams in while refusing
    # 64 (the router would see room that submit then refuses)
    g = gate({64: 0.040, 128: 0.038})
    assert all(g.refuses(n, n - 1) is not None for n in range(2, 129))  # below 64: bounded by 64's 40 ms
    assert g.room(1, 1, 256) == 0
    one = gate({1: 0.040, 2: 0.038})
    assert one.refuses(2, 1) is not None and one.refuses(3, 2) is not None


def test_an_idle_engine_refuses_nothing():
    # nothing running: nothing to protect and no timing of the current load; the slots decide
    g = gate({1: 0.100, 256: 1.0}, lag=100.0)
    assert g.refuses(256, 0) is None and g.room(0, 0, 256) == 256


def test_old_timings_stop_counting():
    # a bucket timed slow once and refused since never runs again: after FRESH_S its timing no longer refuses
    now = [100.0]
    g = Goodput(1.2, FRAME, bucket, {64: 0.050}, lambda: 0.0, 8, timed_at={64: 100.0}, clock=lambda: now[0])
    assert g.refuses(64, 63) is not None
    now[0] += FRESH_S + 1
    assert g.refuses(64, 63) is None and g.predicted_step(64) is None


def test_refusal_is_monotone_in_streams():
    """What the router's binary search relies on: once n streams are refused, so are n + 1."""
    rng = random.Random(5)
    for _ in range(300):
        fixed, per_row = rng.uniform(0.001, 0.02), rng.uniform(0.00001, 0.0005)
        # noisy timings: a larger bucket may have been timed faster than a smaller one (the whole time varies)
        timed = {b: (fixed + per_row * b) * rng.uniform(0.5, 1.5) for b in rng.sample(BUCKETS, rng.randint(1, 5))}
        g = gate(timed)
        verdicts = [g.refuses(n, n - 1) is not None for n in range(1, 257)]
        assert verdicts == sorted(verdicts), (timed, verdicts.index(True))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stream_waits_for_a_slot_only_as_long_as_the_ending_streams_allow():
    clock = Clock()
    g = Goodput(1.2, FRAME, bucket, {}, lambda: 0, chunk_frames=8, clock=clock, wait_s=1.0)
    assert g.refuses_wait(0) is None and g.refuses_wait(-3) is None  # a slot is free: no wait
    assert g.refuses_wait(1) == "every slot is taken and no stream ended in the last 10 s"
    for _ in range(20):  # 20 streams ended over the last 2 s: 10 per second
        clock.now += 0.1
        g.ended()
    assert g.end_rate() == pytest.approx(20 / 1.9)
    assert g.refuses_wait(10) is None  # ~0.95 s
    assert g.refuses_wait(11) == "every slot is taken: 11 streams would wait about 1.05 s for a slot, over the 1 s " \
                                 "allowed"
    clock.now += 10.0  # they ended too long ago to say how fast slots free now
    assert g.refuses_wait(1) is not None and g.end_rate() is None
    assert Goodput(0, FRAME, bucket, {}, lambda: 0, chunk_frames=8).refuses_wait(100) is None  # admission off
    none = Goodput(1.2, FRAME, bucket, {}, lambda: 0, chunk_frames=8, clock=clock, wait_s=0)
    for _ in range(50):
        clock.now += 0.01
        none.ended()
    assert none.refuses_wait(1) == "every slot is taken and TTS_ADMIT_WAIT=0 queues none"  # no waiting at all
    assert none.refuses_wait(1, head_wait=0.5) == "every slot is taken and TTS_ADMIT_WAIT=0 queues none"


def test_a_queue_whose_head_waited_past_the_limit_takes_no_one_more():
    # streams started together end together: just after a wave of ends the rate says "a slot in no time", then
    # nothing frees for a whole stream; the head of the queue waiting past the limit shows it
    clock = Clock()
    g = Goodput(1.2, FRAME, bucket, {}, lambda: 0, chunk_frames=8, clock=clock, wait_s=1.0)
    for _ in range(100):  # a wave: 100 ended within 0.1 s
        clock.now += 0.001
        g.ended()
    assert g.refuses_wait(5, head_wait=0.9) is None
    assert g.refuses_wait(5, head_wait=1.2) == ("every slot is taken and the stream waiting longest has waited 1.20 "
                                                "s, over the 1 s allowed")
    assert g.refuses_wait(0, head_wait=30.0) is None  # a free slot: no wait at all
