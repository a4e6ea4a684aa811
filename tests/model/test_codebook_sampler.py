"""The fused codebook sampler (Triton: interpreted on CPU here, native on the GPU) against sampling.sample_token."""

from __future__ import annotations

import os

import pytest
import torch
from top_p_reference import random_rows, reference_cut, with_ties

from ttsengine.model.frame import sample_token
from ttsengine.model.kernels.codebook_sampler import sample_codebook_embed, sample_codebook_triton, top_p_cut
from ttsengine.model.kernels.triton_support import triton_major

pytestmark = [
    pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter)"),
    pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="GPU test"),
]


def rows(B, V, seed, dtype=torch.float32, scale=3.0, window=16, id_range=None):
    return random_rows(B, V, seed, dtype, scale, window, id_range)


def both(logits, p, ids, counter):
    args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
    return sample_codebook_triton(logits, *args), sample_token(logits, *args)


# the interpreter runs a program in ~0.1-1 s: few rows, each a different case
@pytest.mark.parametrize("V,B,seeds", [(1024, 4, 2), (160, 8, 2), (4096, 2, 1)])
def test_equals_the_sorted_reference(V, B, seeds):
    for seed in range(seeds):
        logits, p, ids, counter = rows(B, V, seed)
        got, want = both(logits, p, ids, counter)
        assert torch.equal(got, want), (seed, got, want)


def test_without_penalty_window_and_at_the_edges_of_top_p():
    logits, p, ids, counter = rows(4, 1024, 7)
    p.top_p[:3] = torch.tensor([1.0, 1e-6, 0.999])  # everything, only the best, nearly everything
    p.temperature[0] = 0.0  # clamped to 1e-5, as the reference does: the best entry
    got, want = both(logits, p, None, counter)
    assert torch.equal(got, want)
    assert got[1] == logits[1].argmax()  # top_p below the best entry's mass keeps only it


def test_bf16_logits_a_strided_row_and_a_peaked_distribution():
    logits, p, ids, counter = rows(3, 4096, 3, dtype=torch.bfloat16, scale=12.0, id_range=1024)
    view = logits[:, :1024]  # the fast head's logits are a slice of a wider row
    got, want = both(view, p, ids, counter)
    assert torch.equal(got, want)
    strided_ids = torch.stack([ids, ids], dim=2)[:, :, 0]  # a window column view: ids 2 apart
    assert torch.equal(both(view, p, strided_ids, counter)[0], want)
    view[:, 0] = view.max()  # token 0 ties the best, not in a window of 12 (not a power of two): the window's
    window = ids[:, :12].clamp(min=1)  # padding must not penalise it (the reference with the kernel's tie rule)
    got = sample_codebook_triton(view, p.temperature, p.top_p, p.repetition_penalty, window, p.seed_lo, p.seed_hi,
                                 counter)
    assert torch.equal(got, with_ties(view, p, window, counter)[0])


def test_peaked_rows_with_ties_at_the_cut_keep_every_tied_entry():
    # bf16 logits of a peaked row tie often; the kernel keeps every entry tied with the smallest kept one
    logits, p, ids, counter = rows(6, 1024, 11, dtype=torch.bfloat16, scale=8.0)
    want, _ = with_ties(logits, p, ids, counter)
    assert torch.equal(sample_codebook_triton(logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo,
                                              p.seed_hi, counter), want)
    top_p = torch.tensor([0.0, -1.0, 1e-9])  # nothing fits: only the best (and its ties) stay
    got = sample_codebook_triton(logits[:3], p.temperature[:3], top_p, p.repetition_penalty[:3], None,
                                 p.seed_lo[:3], p.seed_hi[:3], counter[:3])
    x = logits.float()
    assert all(x[i, got[i]] == x[i].max() for i in range(3))


def test_the_offset_keys_the_noise_and_the_embedding_rows_come_along():
    logits, p, ids, counter = rows(2, 1024, 5)
    table = torch.randn(4096, 64).to(torch.bfloat16)
    args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi)
    for k in (1, 9):
        tokens, x = sample_codebook_embed(logits, *args, counter, k, table)
        assert torch.equal(tokens, sample_token(logits, *args, counter + k))
        assert torch.equal(x, table[tokens])
    tokens, x = sample_codebook_embed(logits, *args, counter, 3)
    assert x is None and torch.equal(tokens, sample_token(logits, *args, counter + 3))
    with pytest.raises(ValueError, match="contiguous"):
        sample_codebook_embed(logits, *args, counter, 1, table.t())


@pytest.mark.parametrize("scale, dtype, top_p", [(8.0, torch.bfloat16, (0.05, 0.5, 0.9, 0.99)),
                                                 (2.0, torch.float32, (0.2, 0.7, 0.8, 0.95)),
                                                 (0.2, torch.bfloat16, (0.3, 0.6, 0.85, 0.97))])
def test_the_cut_is_the_rule_exactly(scale, dtype, top_p):
    # the kept set itself (a token test sees it only where the draw lands near the cut): peaked, middling and nearly
    # flat rows, bf16 (ties) and fp32
    logits, p, _, _ = rows(4, 1024, 20, dtype=dtype, scale=scale)
    want, margin = reference_cut(logits.float(), torch.tensor(top_p))
    got = top_p_cut(logits, torch.tensor(top_p))
    clear = margin > 2e-6  # a decision within fp32 rounding of top_p may go either way
    assert clear.sum() >= 3, (scale, dtype)
    assert torch.equal(got[clear].double(), want[clear]), (scale, dtype, got, want)


def test_a_frame_with_the_fused_codebook_draws_equals_the_reference():
    # model/frame.sample_frame on the tiny checkpoint: every codebook through sample_codebook_embed (counter + k and
    # the next fast input inside the kernel) == the reference sampler + embedding, with and without a window
    from conftest import MODEL_DIR

    from ttsengine import EngineConfig
    from ttsengine.engine.loader import load
    from ttsengine.model.frame import FrameOps, sample_frame
    from ttsengine.model.sampling import RepetitionWindow

    model = load(EngineConfig(model_dir=MODEL_DIR, device="cpu")).model
    g = torch.Generator().manual_seed(3)
    B, cfg = 3, model.cfg
    hidden = torch.randn(B, cfg.dim, generator=g)
    logits = model.slow_head(hidden)
    _, p, _, _ = rows(B, 16, 4)
    window = RepetitionWindow.empty(B, cfg.num_codebooks + 1, 16, "cpu")
    window.frames.copy_(torch.randint(0, cfg.codebook_size, window.frames.shape, generator=g))
    window.count.fill_(20)
    frame_index = torch.tensor([0, 7, 123456])
    with torch.inference_mode():
        for w in (window, None):
            want = sample_frame(model, logits, hidden, p, frame_index, w, None, FrameOps())
            got = sample_frame(model, logits, hidden, p, frame_index, w, None,
                               FrameOps(sample_embed=sample_codebook_embed))
            assert torch.equal(got, want), (got, want)
