"""The decode step's glue kernels (kernels/step_glue.py; Triton's interpreter here, native on the GPU:
tests/engine/test_gpu_fused.py) against the eager ops they replace."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from conftest import MODEL_DIR
from step_glue_cases import last_frames, step_state

from ttsengine import EngineConfig
from ttsengine.engine.loader import load
from ttsengine.model.kernels import step_glue
from ttsengine.model.kernels.step_glue import (
    finish_step,
    finish_step_reference,
    inputs_supported,
    step_inputs,
    step_inputs_reference,
)
from ttsengine.model.kernels.triton_support import triton_major
from ttsengine.model.sampling import RepetitionWindow

pytestmark = [
    # Triton 2.x's interpreter takes no runtime-sized arange; the engine uses the kernels from Triton 3 on only
    pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter)"),
    pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="GPU test"),
]


@pytest.fixture(scope="module")
def model():
    # fp16: the interpreter rounds fp32 -> fp16 to nearest (its bf16 conversion truncates; bf16 runs on the GPU)
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu", dtype="float16")).model


def cuda_rule_embed(m, frames: torch.Tensor) -> torch.Tensor:
    """DualAR.embed with the scale as CUDA applies a Python-scalar division (x * float32 reciprocal), the codebook
    sum in fp32 in codebook order: the kernel's documented roundings."""
    n, cb = m.cfg.num_codebooks, m.cfg.codebook_size
    dt = m.embeddings.weight.dtype
    tok = frames[:, 0]
    codes = frames[:, 1:] + torch.arange(n) * cb
    vq = m.codebook_embeddings.weight[codes].float().sum(dim=1).to(dt)  # [B, D]
    semantic = ((tok >= m.semantic_begin_id) & (tok <= m.semantic_end_id))[:, None]
    x = (m.embeddings.weight[tok].float() + torch.where(semantic, vq, torch.zeros_like(vq)).float()).to(dt)
    if m.cfg.scale_codebook_embeddings:
        inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor((n + 1) ** 0.5, dtype=torch.float32)
        x = torch.where(semantic, (x.float() * inv).to(dt), x)
    return x[:, None]


@pytest.mark.parametrize("scale,block", [(False, 256), (True, 256), (True, 16)])
def test_step_inputs_equal_the_embedding_and_rope_rows(model, scale, block, monkeypatch):
    # block 16: the tiny model's 64 columns in four programs a row (the real model's 1,024 in four of 256)
    monkeypatch.setattr(step_glue, "BLOCK_D", block)
    monkeypatch.setattr(model, "cfg", dataclasses.replace(model.cfg, scale_codebook_embeddings=scale))
    assert inputs_supported(model)
    frames, pos = last_frames(model, 9, seed=int(scale))
    x, rope = step_inputs(model, frames, pos)
    want_x, want_rope = step_inputs_reference(model, frames, pos)
    assert torch.equal(rope, want_rope)
    assert torch.equal(x, cuda_rule_embed(model, frames))
    # against the eager ops on this CPU (a true division by the scale): at most one unit in the last place
    ulp = torch.finfo(torch.float16).eps * want_x.float().abs().clamp_min(2.0 ** -14)
    assert x.shape == want_x.shape and bool(((x.float() - want_x.float()).abs() <= ulp).all())
    if not scale:
        assert torch.equal(x, want_x)


def test_fp32_models_keep_the_eager_inputs():
    m = load(EngineConfig(model_dir=MODEL_DIR, device="cpu", dtype="float32")).model
    assert not inputs_supported(m)  # an fp32 sum's order shows in its bits: the exact path stays eager


@pytest.mark.parametrize("B,n1,W", [(6, 11, 16), (5, 5, 3)])
def test_finish_step_equals_the_eager_end_of_the_step(B, n1, W):
    args = step_state(B, n1, W, seed=B)
    clone = [RepetitionWindow(a.frames.clone(), a.count.clone()) if isinstance(a, RepetitionWindow) else a.clone()
             for a in args]
    frame, active, fresh, state, out, pos, index, window = args
    finish_step(frame, active, fresh, state[:B], out[:B], pos[:B], index[:B], window.view(B))
    f2, a2, fr2, st2, o2, p2, i2, w2 = clone
    finish_step_reference(f2, a2, fr2, st2[:B], o2[:B], p2[:B], i2[:B], w2.view(B))
    for got, want in ((fresh, fr2), (state, st2), (out, o2), (pos, p2), (index, i2), (window.frames, w2.frames),
                      (window.count, w2.count)):
        assert torch.equal(got, want)  # the rows past B untouched too
    assert torch.equal(frame, f2)  # the step's frame is only read
