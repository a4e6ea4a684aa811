"""Weight-only quantization on the tiny model: smaller, close to fp32, and the engines run with it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR
from safetensors.torch import load_file

from ttsengine import ConfigError, Engine, EngineConfig, SynthesisRequest
from ttsengine.model.checkpoint import load_checkpoint
from ttsengine.model.layers import causal_mask_from_positions
from ttsengine.model.quant import Int8Linear, quantize, weight_bytes


def logits(ck, prompt):
    T = prompt.shape[-1]
    pos = torch.arange(T)[None]
    with torch.inference_mode():
        return ck.model.slow_head(ck.model.slow_forward(ck.model.embed(prompt[None]), pos,
                                                        causal_mask_from_positions(pos, T)))[0]


@pytest.mark.parametrize("torchao", [True, False])
def test_int8_is_smaller_and_close(monkeypatch, torchao):
    if not torchao:
        monkeypatch.setitem(sys.modules, "torchao", None)  # the built-in int8 linear
    ref, q = load_checkpoint(MODEL_DIR), load_checkpoint(MODEL_DIR)
    done = quantize(q.model, "int8")
    assert done.startswith("int8 (") and ("torchao" in done) == (torchao and "built-in" not in done)
    assert weight_bytes(q.model) < 0.6 * weight_bytes(ref.model)
    prompt = load_file(str(MODEL_DIR.parent / "prompts.safetensors"))["prompt_b"]
    a, b = logits(ref, prompt), logits(q, prompt)
    assert ((a - b).norm() / a.norm()).item() < 0.03
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.95


def test_builtin_int8_linear_matches_its_dequantized_weights():
    lin = torch.nn.Linear(32, 48)
    q = Int8Linear(lin)
    x = torch.randn(5, 32)
    w = q.weight_int8.float() * q.scale[:, None]
    assert torch.allclose(q(x), x @ w.T + lin.bias, atol=1e-5)
    assert (w - lin.weight).abs().max() <= q.scale.max() / 2 + 1e-6  # rounding error at most half a step


def test_bad_modes():
    ck = load_checkpoint(MODEL_DIR)
    with pytest.raises(ConfigError, match="not one of"):
        quantize(ck.model, "int3")
    with pytest.raises(ConfigError, match="int4 needs a CUDA device"):
        quantize(ck.model, "int4")


def test_engine_serves_int8():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", quant="int8", max_batch=2))
    try:
        r = eng.synthesize(SynthesisRequest(text="Quantized voice.", seed=1, max_new_tokens=12))
        assert r.frames == 11 and np.isfinite(r.audio).all()
        assert eng.stats()["quantization"].startswith("DualAR int8")
    finally:
        eng.close()
