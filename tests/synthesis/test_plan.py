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
