"""The batched serving engine on CPU: equal to the reference engine, streaming, cancellation,
backpressure, async iteration, slot churn."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import MODEL_DIR

from ttsengine import BusyError, Engine, EngineConfig, InputError, Reference, SynthesisRequest

AUDIO_TOL = 5e-5  # streaming vs whole-chunk decode, fp32


def same(a, b) -> None:
    assert [(c.frames, c.finish_reason, c.prompt_tokens) for c in a.chunks] == \
           [(c.frames, c.finish_reason, c.prompt_tokens) for c in b.chunks]
    assert a.seed == b.seed and len(a.audio) == len(b.audio)
    if len(a.audio):
        assert np.abs(a.audio - b.audio).max() < AUDIO_TOL


def wait_until(cond, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_concurrent_requests_equal_the_reference(engine, eager_engine):
    ref_audio = np.random.default_rng(0).standard_normal(30000).astype(np.float32) * 0.1
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, ref_audio, 44100, format="WAV")
    reqs = [
        SynthesisRequest(text="Hello there.", seed=1, max_new_tokens=30),
        SynthesisRequest(text="A different sentence, longer than the first one.", seed=2, max_new_tokens=45,
                         temperature=0.5, top_p=0.9, repetition_penalty=1.3),
        SynthesisRequest(text="Short.", seed=3, max_new_tokens=12),
        SynthesisRequest(text="First part of a long text. " * 5 + "And the end.", seed=4, max_new_tokens=9,
                         chunk_length=60),
        SynthesisRequest(text="Cloned voice.", seed=5, max_new_tokens=20,
                         references=(Reference(text="some words", audio=buf.getvalue()),)),
    ]
    streams = [engine.submit(r) for r in reqs]
    results = [s.result() for s in streams]
    assert len(results[3].chunks) > 2  # the long text continued chunk by chunk
    for req, got in zip(reqs, results):
        same(eager_engine.synthesize(req), got)


def test_more_requests_than_slots_all_finish_equal(engine, eager_engine):
    rng = np.random.default_rng(7)
    reqs = [SynthesisRequest(text=f"Request number {i}.", seed=100 + i, max_new_tokens=int(rng.integers(2, 40)))
            for i in range(16)]  # 16 requests through 8 slots: joins, leaves and slot moves every step
    streams = [engine.submit(r) for r in reqs]
    for req, stream in zip(reqs, streams):
        same(eager_engine.synthesize(req), stream.result())


def test_audio_streams_before_the_request_ends(engine):
    stream = engine.submit(SynthesisRequest(text="Stream me.", seed=9, max_new_tokens=60), ignore_stop=True)
    chunks = list(stream)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    sizes = [len(c.audio) // 2048 for c in chunks]
    assert sizes[0] == engine.settings.first_chunk_frames and len(chunks) > 5
    assert sum(sizes) == 59  # 60 generated, the last dropped; ignore_stop generates all of them
    assert stream.first_audio_at < stream.finished_at and stream.ttfa > 0


def test_async_iteration(engine):
    async def run():
        stream = engine.submit(SynthesisRequest(text="Async.", seed=3, max_new_tokens=20))
        return [c async for c in stream]

    chunks = asyncio.run(run())
    assert sum(len(c.audio) for c in chunks) == 19 * 2048


def test_cancel_frees_the_slot_within_a_step(engine):
    stream = engine.submit(SynthesisRequest(text="Long one.", seed=1, max_new_tokens=3000), ignore_stop=True)
    it = iter(stream)
    next(it)  # generation is under way
    steps = engine.metrics.steps
    stream.cancel()
    assert wait_until(lambda: not engine.scheduler.running)
    assert engine.metrics.steps - steps <= 2  # the step in flight, at most one more
    assert list(it) == [] or all(c.audio.size for c in it)
    assert stream.done and stream.reports[-1].finish_reason == "cancelled"
    assert engine.submit(SynthesisRequest(text="Next.", seed=2, max_new_tokens=5)).result().frames == 4


def test_bad_request_fails_at_submit(engine):
    with pytest.raises(InputError, match="top_p"):
        engine.submit(SynthesisRequest(text="x", top_p=0))


def test_max_new_tokens_one(engine):
    r = engine.submit(SynthesisRequest(text="hi", seed=1, max_new_tokens=1)).result()
    assert r.frames == 0 and len(r.audio) == 0


def test_full_engine_answers_busy_at_once():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=1, max_queue=1))
    try:
        long = SynthesisRequest(text="Long.", seed=1, max_new_tokens=4000)
        a = eng.submit(long, ignore_stop=True)
        assert wait_until(lambda: len(eng.scheduler.running) == 1)
        b = eng.submit(long, ignore_stop=True)  # waits for the slot
        t0 = time.perf_counter()
        with pytest.raises(BusyError, match="busy"):
            eng.submit(long)
        assert time.perf_counter() - t0 < 0.5
        assert eng.stats()["rejected"] == 1
        a.cancel()
        b.cancel()
        assert wait_until(lambda: a.done and b.done)
    finally:
        eng.close()
