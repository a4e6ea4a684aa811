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
