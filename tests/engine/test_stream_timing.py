"""What a Stream tells /metrics: the engine's device, and when it left the queue (its first prefill), on the host
clock, before its first audio."""

from __future__ import annotations

from ttsengine import SynthesisRequest


def test_queue_wait_and_device(engine):
    text = "First part of a long text. " * 5 + "And the end."
    stream = engine.submit(SynthesisRequest(text=text, seed=4, max_new_tokens=9, chunk_length=60))
    assert stream.device == "cpu"
    stream.result()
    assert stream.text_chunks > 1  # later chunks are prefilled again: the first prefill is the one kept
    assert stream.submitted_at <= stream.started_at < stream.first_audio_at <= stream.finished_at
    assert 0 <= stream.queue_wait < stream.ttfa


def test_a_request_that_never_left_the_queue_waited_until_it_ended():
    # /metrics observes waited(): a client that gives up while queued is the longest wait, not a missing one
    import time

    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2), start=False)  # nothing runs
    try:
        stream = eng.submit(SynthesisRequest(text="Queued.", seed=1, max_new_tokens=5))
        stream.cancel()
        now = time.perf_counter()
        assert stream.started_at is None and stream.queue_wait is None
        assert stream.waited(now) == now - stream.submitted_at > 0
    finally:
        eng.close()


def test_waited_is_the_queue_wait_once_started(engine):
    stream = engine.submit(SynthesisRequest(text="Started.", seed=2, max_new_tokens=5))
    stream.result()
    assert stream.waited(stream.finished_at + 100.0) == stream.queue_wait
