"""The fused codebook sampler (Triton: interpreted on CPU here, native on the GPU) against sampling.sample_token."""

from __future__ import annotations

import os

import pytest
import torch
from top_p_reference import random_rows

from ttsengine.model.frame import sample_token
from ttsengine.model.kernels.codebook_sampler import sample_codebook_triton
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
