"""The adaptive prefill budget: the whole limit while nothing decodes; beside decoding streams, what fits in
80% of the frame period next to the measured step at that batch bucket; never below the floor."""

from __future__ import annotations

import pytest

from ttsengine.engine.control.prefill_budget import (
    FIT_MIN,
    FIT_REACH,
    HEADROOM,
    SLACK_MARGIN_S,
    SLACK_STEP_MAX_S,
    PrefillBudget,
    fit_cost,
    iteration_seconds,
    listener_slack,
)

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


# ---- prefill_fit: a fixed part plus a part per position ---------------------------------------------------------
def test_the_fit_separates_the_fixed_cost_from_the_cost_per_position():
    exact = [(n, 0.001 + 2e-6 * n) for n in (44, 88, 176, 352, 44, 132, 264, 440)]  # 1 ms + 2 us a position
    fixed, per_token, seen = fit_cost(exact)
    assert fixed == pytest.approx(0.001) and per_token == pytest.approx(2e-6) and seen == 440
    assert fit_cost(exact[: FIT_MIN - 1]) is None  # too few
    assert fit_cost([(44, 0.001)] * 4 + [(60, 0.0011)] * 4) is None  # too alike to tell the two apart
    assert fit_cost([(n, 0.003 - 1e-6 * n) for n in (44, 88, 176, 352) * 2]) is None  # noise: a negative slope


def test_with_the_fit_a_step_takes_what_fits_beside_the_fixed_cost_within_its_reach():
    def fed(fit: bool) -> PrefillBudget:
        b = PrefillBudget(limit=8192, frame_seconds=FRAME, floor=64, fit=fit)
        b.observe(256, 0, 0.015)  # the full batch's step: 15 ms
        for n in (44, 88, 44, 132, 44, 176, 88, 44):  # one to four prompts a step, 1 ms + 2 us a position
            b.observe(256, n, 0.015 + 0.001 + 2e-6 * n)
        return b

    averaged, fitted = fed(False), fed(True)
    assert averaged.cost is None and not averaged.samples  # off: nothing recorded, the old budget
    assert averaged.tokens(256) == int((HEADROOM * FRAME - 0.015) / averaged.token_seconds)  # ~1,000: 20 us each
    room = HEADROOM * FRAME - 0.015
    assert fitted.tokens(256) == min(int((room - 0.001) / 2e-6), int(FIT_REACH * 176)) == 704  # the reach binds
    for n in (704, 2816):  # the steps it allowed, at the same cost: the reach grows with what was seen
        fitted.observe(256, n, 0.015 + 0.001 + 2e-6 * n)
    assert int((room - 0.001) / 2e-6) > 10_000 and fitted.tokens(256) == 8192 > 4 * averaged.tokens(256)  # the limit


# ---- slack_prefill: longer steps while every listener has audio in hand ----------------------------------------
def test_an_iteration_may_spend_the_listeners_audio_less_the_margin_up_to_the_cap():
    real_time = HEADROOM * FRAME
    assert iteration_seconds(FRAME, 0.0) == real_time  # no slack: the real-time budget
    assert iteration_seconds(FRAME, SLACK_MARGIN_S + 0.01) == real_time  # less than a frame's headroom to spend
    assert iteration_seconds(FRAME, SLACK_MARGIN_S + 0.06) == pytest.approx(0.06)
    assert iteration_seconds(FRAME, 30.0) == SLACK_STEP_MAX_S  # never a longer step than the cap


def test_the_budget_grows_with_slack_and_stays_within_the_limit():
    b = PrefillBudget(limit=4096, frame_seconds=FRAME, floor=64)
    b.observe(8, 0, 0.010)
    b.observe(8, 1000, 0.030)  # 20 us a position
    assert b.tokens(8, slack=0.0) == b.tokens(8) == int((HEADROOM * FRAME - 0.010) / 20e-6)
    assert b.tokens(8, slack=SLACK_MARGIN_S + 0.06) == pytest.approx(2500, abs=1)  # (60 - 10 ms) / 20 us: > real time's
    assert b.tokens(8, slack=30.0) == 4096  # the cap's room (4,500) is beyond TTS_PREFILL_TOKENS


def test_listener_slack_is_the_least_audio_ahead_of_any_playing_listener():
    now = 100.0
    # 100 frames (4.64 s) made, playing for 1 s: 3.64 s ahead; 43 frames (2.0 s) playing for 1.5 s: 0.5 s ahead
    assert listener_slack([(100, now - 1.0), (43, now - 1.5)], now, FRAME) == pytest.approx(43 * FRAME - 1.5)
    assert listener_slack([(10, now - 5.0)], now, FRAME) == 0.0  # behind playback already: nothing to spend
    assert listener_slack([], now, FRAME) == 0.0  # nobody playing
