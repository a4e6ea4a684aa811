"""Features slack_prefill and prefill_fit on a real engine (tiny model, CPU): the switches reach the engine, the
engine's slack is the audio its playing streams have ahead of playback, and requests queued behind playing streams
get the same audio with either as without (they change when prompts are prefilled, never what is generated)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import MODEL_DIR

from ttsengine import EngineConfig, SynthesisRequest
from ttsengine.engine.engine import Engine


def run(features: str) -> tuple[list[np.ndarray], list[float]]:
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, max_queue=4, features=features))
    try:
        assert eng.settings.slack_prefill is (features == "+slack_prefill")
        first = eng.submit(SynthesisRequest(text="A long first one.", seed=1, max_new_tokens=120), ignore_stop=True)
        chunks = iter(first)
        next(chunks)  # it plays
        slacks = []
        for _ in range(3):  # the slack while it plays: what it made less what played since its first audio
            time.sleep(0.1)  # on this machine a stream runs several times real time: past the 1 s margin
            slacks.append(eng._listener_slack(list(eng.scheduler.running)))
        queued = [eng.submit(SynthesisRequest(text=f"Queued number {i}.", seed=2 + i, max_new_tokens=30),
                             ignore_stop=True) for i in range(3)]
        audio = [np.concatenate([c.audio for c in s]) for s in queued]
        list(chunks)
        return audio, slacks
    finally:
        eng.close()


def test_queued_requests_get_the_same_audio_with_slack_prefill():
    on, slacks = run("+slack_prefill")
    off, _ = run("auto")
    assert all(s >= 0.0 for s in slacks)
    for a, b in zip(on, off):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_the_slack_is_what_the_playing_stream_has_ahead():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=1, features="+slack_prefill"))
    try:
        stream = eng.submit(SynthesisRequest(text="A long one.", seed=1, max_new_tokens=200), ignore_stop=True)
        chunks = iter(stream)
        next(chunks)
        task = eng.scheduler.running[0].owner
        now = time.perf_counter()
        made = (task.audio_offset + task.decoded) * eng.budget.frame_seconds
        got = eng._listener_slack(list(eng.scheduler.running))
        assert got == pytest.approx(max(0.0, made - (now - stream.first_audio_at) - eng.vocoder.lag), abs=0.05)
        stream.cancel()
        list(chunks)
    finally:
        eng.close()


def test_queued_requests_get_the_same_audio_with_prefill_fit():
    for features, fit in (("auto", True), ("-prefill_fit", False)):  # on by default; the off switch reaches the budget
        eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=1, features=features))
        try:
            assert eng.budget.fit is fit
        finally:
            eng.close()
    on, _ = run("auto")
    off, _ = run("-prefill_fit")
    for a, b in zip(on, off):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4)
