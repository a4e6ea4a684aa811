"""The eager reference engine end to end on the tiny checkpoint (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ttsengine import InputError, NoAudio, Reference, SynthesisRequest
from ttsengine.model.generation import frame_budget


def test_short_text_gives_whole_frames(eager_engine):
    r = eager_engine.synthesize(SynthesisRequest(text="Hello there.", seed=3, max_new_tokens=30))
    assert r.sample_rate == 44100 and r.audio.dtype == np.float32
    assert len(r.audio) == r.frames * 2048 and r.frames == 29  # 30 generated, the last dropped
    assert np.abs(r.audio).max() <= 1.0 and np.isfinite(r.audio).all()
    assert r.chunks[0].finish_reason == "length"


def test_seed_reproduces_and_varies(eager_engine):
    req = SynthesisRequest(text="Same words.", seed=11, max_new_tokens=12)
    a, b = eager_engine.synthesize(req), eager_engine.synthesize(req)
    assert np.array_equal(a.audio, b.audio) and a.seed == 11
    c = eager_engine.synthesize(SynthesisRequest(text="Same words.", seed=12, max_new_tokens=12))
    assert not np.array_equal(a.audio, c.audio)
    d = eager_engine.synthesize(SynthesisRequest(text="Same words.", max_new_tokens=12))
    e = eager_engine.synthesize(SynthesisRequest(text="Same words.", seed=d.seed, max_new_tokens=12))
    assert np.array_equal(d.audio, e.audio)  # the drawn seed is reported and reproduces the result


def test_stream_equals_synthesize(eager_engine):
    req = SynthesisRequest(text="First sentence here. " * 8 + "Last one.", seed=5, max_new_tokens=6,
                           chunk_length=60)
    whole = eager_engine.synthesize(req)
    chunks = list(eager_engine.stream(req))
    assert len(chunks) == len(whole.chunks) > 1
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert np.array_equal(np.concatenate([c.audio for c in chunks]), whole.audio)


def test_long_text_keeps_previous_chunk_as_context(eager_engine):
    sentences = [f"This is sentence number {i}, which talks about item {i * 7}." for i in range(90)]
    text = " ".join(sentences)
    assert len(text) >= 5000
    r = eager_engine.synthesize(SynthesisRequest(text=text, seed=1, max_new_tokens=4, chunk_length=200))
    assert len(r.chunks) >= 25 and all(len(c.text) <= 200 for c in r.chunks)
    assert " ".join(c.text for c in r.chunks) == text
    assert len(r.audio) == r.frames * 2048 and r.frames == 3 * len(r.chunks)
    # chunk i's prompt = its own prompt + the previous chunk as a reference block (text + its codes)
    for prev, cur in zip(r.chunks, r.chunks[1:]):
        alone = eager_engine.planner.prompt(cur.text, []).shape[1]
        prev_codes = torch.zeros(4, prev.frames, dtype=torch.int64)
        with_context = eager_engine.planner.prompt(cur.text, [(prev.text, prev_codes)])
        assert cur.prompt_tokens == with_context.shape[1] > alone
        assert not cur.context_dropped


def test_prompt_too_long_is_rejected_before_audio(eager_engine):
    huge = np.zeros((4, eager_engine.planner.prompt_limit), dtype=np.int64)
    with pytest.raises(InputError, match=r"needs \d+ prompt tokens; the limit is 2048"):
        eager_engine.start(SynthesisRequest(text="hi", references=(Reference(text="r", codes=huge),)))


def test_context_is_dropped_not_truncated_when_it_does_not_fit(eager_engine):
    # a reference that leaves room for one chunk but not for chunk + previous chunk's codes
    ref = np.zeros((4, eager_engine.planner.prompt_limit - 60), dtype=np.int64)
    r = eager_engine.synthesize(SynthesisRequest(text="Alpha beta gamma delta. " * 6, seed=2, max_new_tokens=40,
                                           chunk_length=60, references=(Reference(text="r", codes=ref),)))
    assert len(r.chunks) > 1 and r.chunks[1].context_dropped


@pytest.mark.parametrize("kwargs, pattern", [
    ({"text": "   "}, "text is empty"),
    ({"text": "x" * 20_001}, "text has 20001 characters; the limit is 20000"),
    ({"text": "hi", "temperature": 0.0}, r"temperature=0.0 is outside the allowed range \[0.1, 1.0\]"),
    ({"text": "hi", "top_p": 1.5}, r"top_p=1.5 is outside"),
    ({"text": "hi", "repetition_penalty": 2.5}, r"repetition_penalty=2.5 is outside"),
    ({"text": "hi", "temperature": float("nan")}, "temperature must be a number"),
    ({"text": "hi", "max_new_tokens": -1}, "max_new_tokens must be an integer"),
    ({"text": "hi", "max_new_tokens": 10**6}, "max_new_tokens must be an integer"),
    ({"text": "hi", "chunk_length": 10}, r"chunk_length must be an integer in \[50, 1000\]"),
    ({"text": "hi", "seed": "abc"}, "seed must be an integer"),
    ({"text": "hi", "seed": 2**70}, "seed must be an integer"),
    ({"text": "hi", "references": (Reference(text="x"),)}, r"references\[0\] needs exactly one of audio or codes"),
])
def test_bad_requests(eager_engine, kwargs, pattern):
    with pytest.raises(InputError, match=pattern):
        eager_engine.start(SynthesisRequest(**kwargs))


def test_special_tokens_in_text_are_plain_by_default(eager_engine):
    plain = eager_engine.planner.prompt("a<|im_end|>b", [])
    assert eager_engine.ckpt.tokenizer.im_end_id not in plain[0].tolist()


def test_frame_budget_follows_upstream():
    assert frame_budget(100, 50, 4096) == 50
    assert frame_budget(100, 0, 4096) == 3996  # 0 fills the context
    assert frame_budget(4000, 1024, 4096) == 96  # cut to what fits
    with pytest.raises(InputError):
        frame_budget(4096, 10, 4096)


def test_max_new_tokens_one_gives_no_audio(eager_engine):
    # the only frame generated is the dropped last one: an error that says so, not an empty result
    with pytest.raises(NoAudio, match="produced no audio"):
        eager_engine.synthesize(SynthesisRequest(text="hi", seed=1, max_new_tokens=1))
    with pytest.raises(NoAudio):
        list(eager_engine.stream(SynthesisRequest(text="hi", seed=1, max_new_tokens=1)))
