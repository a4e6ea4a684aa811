"""The adaptive prefill budget: the whole limit while nothing decodes; beside decoding streams, what fits in
80% of the frame period next to the measured step at that batch bucket; never below the floor."""

from __future__ import annotations

import pytest

from ttsengine.engine.control.prefill_budget import HEADROOM, PrefillBudget

FRAME = 2048 / 44100  # 46.4 ms


def test_the_whole_limit_until_something_decodes_or_is_measured():
    b = PrefillBudget(limit=4096, frame_seconds=FRAME, floor=64)
    assert b.tokens(0) == 4096 and b.tokens(8) == 4096  # nothing measured yet
    b.observe(0, 500, 0.2)  # no decode step: its timing never synced the GPU, so it is ignored
    assert b.step_seconds == {} and b.token_seconds is None


def test_the_budget_fills_the_frame_period_beside_the_step():
    b = PrefillBudget(limit=4096, frame_seconds=FRAME, floor=64)
    b.observe(8, 0, 0.010)  # the step alone at bucket 8: 10 ms
    b.observe(8, 1000, 0.030)  # 1,000 positions added 20 ms: 20 us each
    assert b.step_seconds[8] == pytest.approx(0.010) and b.token_seconds == pytest.approx(20e-6)
    assert b.tokens(8) == int((HEADROOM * FRAME - 0.010) / 20e-6)  # ~1,356: the iteration stays ~37 ms
    b.observe(64, 0, 0.030)  # a bigger batch's step leaves less room
    assert 64 < b.tokens(64) < b.tokens(8)
    b.observe(256, 0, 0.050)  # a step already slower than real time: prefill still moves, by the floor
    assert b.tokens(256) == 64
    tiny = PrefillBudget(limit=32, frame_seconds=FRAME, floor=64, step_seconds={1: 1.0}, token_seconds=1.0)
    assert tiny.tokens(1) == 32  # a floor above the limit: the limit


def test_timings_are_smoothed():
    b = PrefillBudget(limit=4096, frame_seconds=FRAME, floor=64)
    b.observe(4, 0, 0.010)
    b.observe(4, 0, 0.020)
    assert b.step_seconds[4] == pytest.approx(0.012)  # 0.8 * old + 0.2 * new


def test_an_unmeasured_bucket_borrows_a_timed_one_instead_of_the_whole_limit():
    # a long prompt's admission moves the batch into a bucket with no timing (timings come from iterations
    # without prefill, which a steady stream of prefills never leaves): its rest must not go in at once
    b = PrefillBudget(limit=4096, frame_seconds=FRAME, floor=64)
    b.observe(64, 0, 0.030)
    b.observe(64, 1000, 0.040)
    assert b.tokens(128) == b.tokens(64) < 4096  # nothing timed above 128: the largest below
    b.observe(256, 0, 0.050)
    assert b.tokens(128) == 64  # the nearest timed bucket above (slower than real time: the floor)
    assert b.tokens(8) == b.tokens(64)  # a smaller batch: the nearest above
