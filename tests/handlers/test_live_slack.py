"""A live session's slack (serving/live/session.py LiveSession.slack): what its next segment's first audio may wait
without the listener waiting, from the audio it made and the time since its first audio; sent with each segment
after the first as SynthesisRequest.slack_s (the engine's feature segment_slack orders its queue by it)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from conftest import MODEL_DIR

from ttsengine import Engine, EngineConfig, SynthesisRequest
from ttsengine.serving.live.session import SLACK_MARGIN_S, LiveSession, live_job


def session(submit=lambda *a, **k: None) -> LiveSession:
    job, _ = live_job({"text": "", "format": "pcm"}, None)
    return LiveSession(submit, job, max_chars=10_000)


def test_slack_is_the_audio_still_to_play_less_a_margin():
    s = session()
    assert s.slack(now=5.0) == 0.0  # no audio yet: the first segment has a listener waiting
    s._first_audio_at, s.native_rate, s._native = 100.0, 44100, 6 * 44100  # 6 s made, the first at t=100
    assert s.slack(now=101.0) == pytest.approx(6 - 1 - SLACK_MARGIN_S)
    assert s.slack(now=105.5) == 0.0  # less left than the margin: no slack
    fast = session()  # the same audio played at speed 2 lasts half as long
    fast.job = dataclasses.replace(fast.job, speed=2.0)
    fast._first_audio_at, fast.native_rate, fast._native = 100.0, 44100, 6 * 44100
    assert fast.slack(now=101.0) == pytest.approx(3 - 1 - SLACK_MARGIN_S)


def test_each_segment_after_the_first_is_submitted_with_the_slack_it_has():
    """A real session on the tiny model (CPU): two sentences, two segments; the first is submitted with no slack,
    the second with what the session's slack() said when it was submitted."""
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2))
    sent: list[tuple[float, float]] = []  # (slack_s sent, the session's slack() right after)
    box: dict = {}

    def submit(request: SynthesisRequest, **kw):
        sent.append((request.slack_s, box["s"].slack()))
        return eng.submit(request, **kw)

    async def speak():
        s = box["s"] = session(submit)
        s.text("One short sentence. ")
        s.text("And a second one. ")
        s.end()
        return [piece async for piece in s.audio()]

    try:
        out = asyncio.run(speak())
    finally:
        eng.close()
    assert any(isinstance(p, bytes) for p in out)
    assert len(sent) == 2 and sent[0] == (0.0, 0.0)
    assert sent[1][0] == pytest.approx(sent[1][1], abs=0.05)  # what slack() said (it only falls as audio plays)


@pytest.mark.parametrize("on", [True, False])
def test_with_segment_slack_a_request_with_slack_starts_after_one_due_before_it(on):
    """One slot, taken; A (30 s of slack) then B (none) queue: with segment_slack B starts first, without it A."""
    features = "+segment_slack" if on else "auto"
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=1, max_queue=4, features=features))
    try:
        assert eng.settings.segment_slack is on
        busy = eng.submit(SynthesisRequest(text="Long.", seed=1, max_new_tokens=2000), ignore_stop=True)
        until = time.monotonic() + 60
        while busy.started_at is None:
            assert time.monotonic() < until
            time.sleep(0.01)
        a = eng.submit(SynthesisRequest(text="Patient one.", seed=2, max_new_tokens=4, slack_s=30.0))
        b = eng.submit(SynthesisRequest(text="Waiting one.", seed=3, max_new_tokens=4))
        while eng.scheduler.queue_depth < 2:  # both queued behind the busy slot
            assert time.monotonic() < until
            time.sleep(0.01)
        busy.cancel()
        for s in (busy, a, b):
            list(s)
        assert (b.started_at < a.started_at) is on
    finally:
        eng.close()
