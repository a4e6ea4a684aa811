"""The draw's counter-based Exp(1) noise (sampling.exponential_noise)."""

from __future__ import annotations

import os

import pytest
import torch

from ttsengine.model.frame import sample_token
from ttsengine.model.kernels.triton_support import triton_major
from ttsengine.model.sampling import SamplingTensors, exponential_noise

# a row whose hash reaches the top value at index 128,667 of the slow vocabulary: its uniform was 1 - 2^-25, which
# rounds to 1.0 in fp32, its noise -0.0 (found by the sort-free sampler's GPU test)
SEED, COUNTER, INDEX, V = 99, 450_835_192_227, 128_667, 155_776


def test_noise_is_positive_where_the_hash_is_at_its_top():
    q = exponential_noise(torch.tensor([SEED]), torch.tensor([0]), torch.tensor([COUNTER]), V)
    assert q.min().item() > 0
    assert q[0, INDEX].item() == q.min().item()  # the top hash value: the smallest noise, as a uniform near 1 gives


def test_an_entry_top_p_dropped_is_never_drawn():
    # every entry but index 7 is outside the nucleus (probability 0): 0 / noise must not be nan there (argmax
    # takes nan), so the token is 7
    logits = torch.full((1, V), -5.0)
    logits[0, 7] = 20.0
    p = SamplingTensors.from_values([(1.0, 0.5, 1.0, SEED)], "cpu")
    token = sample_token(logits, p.temperature, p.top_p, p.repetition_penalty, None, p.seed_lo, p.seed_hi,
                         torch.tensor([COUNTER]))
    assert token.item() == 7


@pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter)")
@pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="GPU test")
@pytest.mark.parametrize("V,counter,index", [(V, COUNTER, INDEX), (1024, 11_297, 701)])
def test_the_fused_samplers_draw_the_entry_whose_noise_is_smallest(V, counter, index):
    # every entry equally likely (flat logits, top_p 1): the draw is the entry with the smallest noise, the one at
    # the hash's top value (uncapped, its noise was -0 and the entry could never be drawn: -inf, or nan in the
    # codebook kernel for an entry top-p dropped); the reference, the vocab sampler (bf16) and the codebook sampler
    # (seed 99, counter 11,297: index 701 of 1,024) agree
    from ttsengine.model.kernels.codebook_sampler import sample_codebook_triton
    from ttsengine.model.kernels.vocab_sampler import sample_vocab_triton

    logits = torch.zeros((1, V), dtype=torch.bfloat16)
    p = SamplingTensors.from_values([(1.0, 1.0, 1.0, SEED)], "cpu")
    args = (p.temperature, p.top_p, p.repetition_penalty, None, p.seed_lo, p.seed_hi, torch.tensor([counter]))
    kernel = sample_vocab_triton if V > 4096 else sample_codebook_triton
    assert sample_token(logits, *args).item() == index
    assert kernel(logits, *args).item() == index
