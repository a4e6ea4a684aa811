"""What the fused samplers' tests share: random sampling rows, and the sorted top-p reference with the fused samplers'
rule at ties (kernels/vocab_sampler.py)."""

from __future__ import annotations

import torch

from ttsengine.model.sampling import SamplingTensors, apply_repetition_penalty, draw, exponential_noise, top_p_filter


def random_rows(B, V, seed, dtype=torch.float32, scale=3.0, window=16, id_range=None):
    """-> (logits [B, V], SamplingTensors with a random temperature / top_p / penalty / seed per row, window ids
    [B, window] below id_range (default V), counters [B]) on the CPU."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * scale).to(dtype)
    params = SamplingTensors.from_values(
        [(0.3 + 0.9 * torch.rand(1, generator=g).item(), 0.5 + 0.5 * torch.rand(1, generator=g).item(),
          1.0 + 0.5 * torch.rand(1, generator=g).item(), int(torch.randint(0, 2**62, (1,), generator=g)))
         for _ in range(B)], "cpu")
    ids = torch.randint(0, id_range or V, (B, window), generator=g)
    counter = torch.randint(0, 2**40, (B,), generator=g)
    return logits, params, ids, counter


def with_ties(logits, p, ids, counter):
    """sample_token with its top-p cut extended to every entry tied with the smallest kept one: the sorted reference
    decides where the cut is, then entries equal to it stay too (the kernel's rule). Equal to sample_token wherever
    no tie straddles the cut; returns (tokens, which rows had one)."""
    x = logits.float()
    if ids is not None:
        x = apply_repetition_penalty(x, ids, p.repetition_penalty)
    kept = torch.isfinite(top_p_filter(x, p.top_p))
    cut = torch.where(kept, x, float("inf")).min(dim=1, keepdim=True).values
    straddles = ((x == cut) & ~kept).any(dim=1)
    x = torch.where(x >= cut, x, float("-inf"))
    probs = torch.softmax(x / p.temperature.clamp(min=1e-5)[:, None], dim=-1)
    return draw(probs, exponential_noise(p.seed_lo, p.seed_hi, counter, x.shape[1])), straddles


def reference_cut(x, top_p):
    """x: penalised fp32 logits [B, V] -> (the smallest kept value per row by the rule, in float64: the largest value
    v with mass(> v) + p(v) <= top_p, at most the best; how far each row's decision is from flipping)."""
    cuts, margins = [], []
    for row, P in zip(x, top_p.double()):
        xs, order = row.sort(descending=True)
        ps = torch.softmax(row.double(), dim=0)[order]
        values, counts = torch.unique_consecutive(xs, return_counts=True)  # distinct values, descending
        first = torch.cumsum(counts, 0) - counts  # each value's first position in the order
        cond = (torch.cumsum(ps, 0) - ps)[first] + ps[first]  # mass above the value + its own p
        k = max(int((cond <= P).sum()), 1)  # a prefix: the condition only gets easier as the value grows
        cuts.append(values[k - 1].item())
        margins.append((cond - P).abs().min().item())
    return torch.tensor(cuts, dtype=torch.float64), torch.tensor(margins)
