"""The planner: each text part tokenized once per request, prompts unchanged by it, the capacity guard applied
to every request and to the previous chunk's context (tiny checkpoint, CPU)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from ttsengine import InputError, Reference, SynthesisRequest
from ttsengine.synthesis.plan import Planner

LONG = SynthesisRequest(text="Alpha beta gamma delta. " * 6, seed=2, max_new_tokens=20, chunk_length=60,
                        references=(Reference(text="the voice's words", codes=np.ones((4, 7), dtype=np.int64)),))


def chunk_prompts(planner: Planner, plan) -> list[torch.Tensor]:
    """Every chunk's prompt as an engine builds them, the previous chunk (3 frames) as context."""
    out, previous = [], None
    for i, text in enumerate(plan.texts):
        prompt, _ = planner.chunk_prompt(plan, i, previous)
        out.append(prompt)
        previous = (text, torch.full((4, 3), i, dtype=torch.int64))
    return out


def test_each_text_part_is_tokenized_once_per_request(eager_engine, monkeypatch):
    planner, tok = eager_engine.planner, eager_engine.ckpt.tokenizer
    calls: Counter[str] = Counter()
    encode = tok.encode

    def counting(text, allow_special=True):
        calls[text] += 1
        return encode(text, allow_special)

    monkeypatch.setattr(tok, "encode", counting)
    plan = planner.plan(LONG)
    prompts = chunk_prompts(planner, plan)
    assert len(plan.texts) > 2 and set(plan.texts) | {"the voice's words"} <= set(calls)
    assert max(calls.values()) == 1, calls.most_common(3)
    monkeypatch.undo()
    # the same prompts as tokenizing each one afresh
    refs = plan.references
    for i, prompt in enumerate(prompts):
        context = [] if i == 0 else [(plan.texts[i - 1], torch.full((4, 3), i - 1, dtype=torch.int64))]
        assert torch.equal(prompt, planner.prompt(plan.texts[i], refs + context))
    assert plan.prompt_lengths == [planner.prompt(t, refs).shape[1] for t in plan.texts]


def test_context_that_would_overflow_the_kv_cache_is_left_out(eager_engine):
    roomy = eager_engine.planner
    plan = roomy.plan(LONG)
    tight = Planner(eager_engine.ckpt, eager_engine.config, kv_positions=max(plan.prompt_lengths) + 20)
    previous = (plan.texts[0], torch.zeros(4, 19, dtype=torch.int64))
    prompt, dropped = tight.chunk_prompt(tight.plan(LONG), 1, previous)  # each chunk fits alone, not with context
    assert dropped and torch.equal(prompt, tight.prompt(plan.texts[1], plan.references))
    prompt, dropped = roomy.chunk_prompt(plan, 1, previous)
    assert not dropped and prompt.shape[1] > plan.prompt_lengths[1]


def test_a_plan_from_a_larger_engine_is_checked_again(eager_engine):
    plan = eager_engine.planner.plan(LONG)
    small = Planner(eager_engine.ckpt, eager_engine.config, kv_positions=max(plan.prompt_lengths) + 5)
    with pytest.raises(InputError, match=r"KV positions; this engine's cache holds \d+ \(max_new_tokens=5 or less"):
        small.plan(plan)
    assert eager_engine.planner.plan(plan) is plan


def _wav(seconds: float, rate: int) -> bytes:
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return buf.getvalue()


def _no_decoding(planner: Planner, monkeypatch) -> None:
    import soxr

    import ttsengine.synthesis.voice_encoder as ve

    monkeypatch.setattr(ve, "load_mono", lambda *a, **k: pytest.fail("decoded a reference"))
    monkeypatch.setattr(planner.voice_encoder, "codes_from_samples", lambda *a: pytest.fail("encoded a reference"))
    monkeypatch.setattr(soxr, "resample", lambda *a, **k: pytest.fail("resampled"))


def test_references_over_the_prompt_budget_are_rejected_from_their_headers(eager_engine, monkeypatch):
    """Many long references: their header lengths (21.5 code frames a second) against the prompt limit, before
    any is decoded or encoded (20 x 59 s once took 79 s of CPU before the 400)."""
    planner = eager_engine.planner
    _no_decoding(planner, monkeypatch)
    ref = _wav(59, 16000)  # 59 s -> 1270 frames; the tiny model's prompt limit is a few thousand
    refs = tuple(Reference(text="r", audio=ref) for _ in range(8))
    with pytest.raises(InputError, match=r"the references need at least 10160 prompt tokens \(471\.8 s of audio\); "
                                         rf"the limit is {planner.prompt_limit} \(use shorter or fewer references\)"):
        planner.plan(SynthesisRequest(text="hi", references=refs))
    # stored codes count too: one long audio reference beside codes that fill the budget
    codes = Reference(text="c", codes=np.ones((4, planner.prompt_limit - 100), dtype=np.int64))
    with pytest.raises(InputError, match="the references need at least"):
        planner.plan(SynthesisRequest(text="hi", references=(codes, Reference(text="r", audio=ref))))


def _hidden_length_flac(seconds: int, rate: int = 44100) -> bytes:
    """Silence as FLAC whose STREAMINFO gives 0 total samples (unknown): only decoding finds its length."""
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(seconds * rate, np.float32), rate, format="FLAC")
    data = bytearray(buf.getvalue())
    data[21] &= 0xF0
    data[22:26] = bytes(4)
    return bytes(data)


def test_references_of_unknown_length_are_measured_only_as_far_as_the_room_left(eager_engine, monkeypatch):
    """Issue 50: references whose header hides their length counted as 0 frames, so 20 x 59 s were decoded and
    encoded (56 s) before the 400. Now they are measured by a decode that keeps nothing and stops at the room
    the others left: never encoded, and the measuring stops at the limit."""
    import ttsengine.audio.decode as decode

    planner = eager_engine.planner
    _no_decoding(planner, monkeypatch)
    ref = _hidden_length_flac(50)  # 1076 code frames each
    assert decode.read_header(ref).frames is None and planner.voice_encoder.header_frames(ref) is None
    blocks = []
    real = decode._blocks  # noqa: SLF001 - counted, to see the measuring stop

    def counted(*args, **kwargs):
        for x in real(*args, **kwargs):
            blocks.append(x.shape[0])
            yield x

    monkeypatch.setattr(decode, "_blocks", counted)
    refs = tuple(Reference(text="r", audio=ref) for _ in range(8))
    with pytest.raises(InputError, match=r"^the references need at least \d+ prompt tokens .*the limit is "
                                         rf"{planner.prompt_limit} \(use shorter or fewer references\)$"):
        planner.plan(SynthesisRequest(text="hi", references=refs))
    measured = sum(blocks) / 44100  # seconds decoded: about the prompt limit's worth, not 8 x 50 s
    assert measured < (planner.prompt_limit + 2 * 1076) / 21.5, measured
    # one such reference within the room is measured whole, and its length is what encoding gives
    assert planner.voice_encoder.measured_frames(_hidden_length_flac(2), room=10_000) == 43


def test_the_number_of_references_is_capped_before_any_is_read(eager_engine, monkeypatch):
    planner = eager_engine.planner
    _no_decoding(planner, monkeypatch)
    monkeypatch.setattr(planner.voice_encoder, "header_frames", lambda *a, **k: pytest.fail("read a header"))
    limit = planner.config.max_references
    refs = tuple(Reference(text="r", audio=b"anything") for _ in range(limit + 1))
    with pytest.raises(InputError, match=rf"^{limit + 1} references; the limit is {limit} \(TTS_MAX_REFERENCES\)$"):
        planner.plan(SynthesisRequest(text="hi", references=refs))


@pytest.mark.parametrize("seconds, rate, words", [
    (50, 8, r"references\[1\]\.audio: sample rate 8 Hz is outside 8000\.\.384000 Hz"),  # once 6.3 s of soxr
    (61, 8000, r"references\[1\]\.audio: 61\.0 s is longer than the limit of 60 s"),
])
def test_every_reference_header_is_checked_before_any_is_encoded(eager_engine, monkeypatch, seconds, rate, words):
    planner = eager_engine.planner
    _no_decoding(planner, monkeypatch)
    good = Reference(text="fine", audio=_wav(1, 22050))
    with pytest.raises(InputError, match=f"^{words}$"):
        planner.plan(SynthesisRequest(text="hi", references=(good, Reference(text="bad", audio=_wav(seconds, rate)))))


def test_header_frames_match_the_encoding(eager_engine):
    encoder = eager_engine.voice_encoder
    for seconds, rate in [(1.0, 44100), (0.7, 22050), (2.3, 48000), (0.5, 8000)]:
        data = _wav(seconds, rate)
        estimate = encoder.header_frames(data)
        assert estimate <= encoder.codes_from_bytes(data).shape[1] <= estimate + 1
        assert encoder.header_frames(data) == encoder.cached(data).shape[1]  # cached: the exact count
