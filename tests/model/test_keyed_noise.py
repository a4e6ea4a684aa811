"""The draw's counter-based Exp(1) noise (sampling.exponential_noise)."""

from __future__ import annotations

import torch

from ttsengine.model.frame import sample_token
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
