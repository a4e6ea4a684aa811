"""The sort-free slow-token sampler (kernels/vocab_sampler.py; Triton interpreted on CPU here) against the sorted
reference, sampling.sample_token, and its rule at a tie on the top-p cut."""

from __future__ import annotations

import math
import os

import pytest
import torch
from top_p_reference import random_rows, reference_cut, with_ties

from ttsengine.model.frame import sample_token
from ttsengine.model.kernels.triton_support import triton_major
from ttsengine.model.kernels.vocab_sampler import sample_vocab_triton, top_p_cut
from ttsengine.model.sampling import SamplingTensors, apply_repetition_penalty

pytestmark = [
    pytest.mark.skipif(triton_major() < 3, reason="needs Triton >= 3 (its interpreter)"),
    pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="GPU test"),
]


def rows(B, V, seed, dtype=torch.bfloat16, scale=3.0, window=11):
    return random_rows(B, V, seed, dtype, scale, window)


def both(logits, p, ids, counter):
    args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
    got, (want, straddles) = sample_vocab_triton(logits, *args), with_ties(logits, p, ids, counter)
    plain = sample_token(logits, *args)
    assert torch.equal(want[~straddles], plain[~straddles])  # the reference with ties is the sorted reference's rule
    return got, want


# scale 3: tens of entries in the nucleus (bf16 ties among them: seed 1's first row has one at its cut, where the
# sorted reference keeps one of two 7.59375s); 0.3: nearly flat (random weights: most of the vocabulary)
@pytest.mark.parametrize("V,B,scale", [(5000, 3, 3.0), (5000, 3, 0.3), (155_776, 2, 1.0)])
def test_equals_the_sorted_reference(V, B, scale):
    logits, p, ids, counter = rows(B, V, 1, scale=scale)
    got, want = both(logits, p, ids, counter)
    assert torch.equal(got, want), (got, want)


def test_the_cut_is_the_rule_exactly_peaked_flat_and_penalised():
    # the kept set itself (a token test sees it only where the draw lands near the cut): 3 x 4 rows, peaked (scale
    # 6), middling (2) and nearly flat (0.2) bf16 logits, half the rows penalising their best ids
    for i, scale in enumerate((6.0, 2.0, 0.2)):
        logits, p, ids, _ = rows(4, 3000, 10 + i, scale=scale)
        ids[::2] = logits[::2].float().topk(11, dim=1).indices
        x = apply_repetition_penalty(logits.float(), ids, p.repetition_penalty)
        want, margin = reference_cut(x, p.top_p)
        got = top_p_cut(logits, p.top_p, p.repetition_penalty, ids)
        clear = margin > 2e-6  # a decision within fp32 rounding of top_p may go either way
        assert clear.sum() >= 3, scale
        assert torch.equal(got[clear].double(), want[clear]), (scale, got, want)


def test_penalised_entries_at_the_top_and_repeated_ids():
    # the window holds the row's best ids (some twice): their penalised fp32 values move among the 16-bit values,
    # across the cut; penalties up to 3 so they do
    logits, p, _, counter = rows(3, 3000, 2, scale=6.0)
    best = logits.float().topk(8, dim=1).indices
    ids = torch.cat([best, best[:, :3]], dim=1)  # [3, 11]
    p.repetition_penalty.copy_(torch.tensor([1.3, 2.0, 3.0]))
    p.top_p.copy_(torch.tensor([0.5, 0.8, 0.95]))
    got, want = both(logits, p, ids, counter)
    assert torch.equal(got, want), (got, want)


def test_without_window_fp16_and_the_edges_of_top_p():
    logits, p, ids, counter = rows(4, 2000, 3, dtype=torch.float16)
    p.top_p.copy_(torch.tensor([1.0, 1e-6, 0.999, 0.7]))  # everything, only the best, nearly everything
    p.temperature[3] = 0.0  # clamped to 1e-5 as the reference does: the best entry
    got, want = both(logits, p, None, counter)
    assert torch.equal(got, want)
    assert got[1] == logits[1].float().argmax() and got[3] == logits[3].float().argmax()


def test_a_tie_at_the_cut_keeps_every_tied_entry_and_nothing_below():
    # one 4.0, then four entries tied at 3.0 (bf16 logits tie often), the rest below 2. top_p admits the 4.0 and two
    # and a half of the tied entries: the sorted reference keeps two of them (which two is up to its sort), the rule
    # here keeps all four. 48 draws (different counters, temperature 1) land on exactly those five entries
    V = 300
    g = torch.Generator().manual_seed(4)
    logits = (torch.rand(V, generator=g) * 2.0 - 1.0)
    tied = torch.tensor([17, 250, 251, 299])
    logits[3], logits[tied] = 4.0, 3.0
    probs = torch.softmax(logits.to(torch.bfloat16).float().double(), 0)
    top_p = (probs[3] + 2.5 * probs[17]).item()
    B = 48
    p = SamplingTensors.from_values([(1.0, top_p, 1.0, 12345)] * B, "cpu")
    counter = torch.arange(B, dtype=torch.int64)
    got = sample_vocab_triton(logits.to(torch.bfloat16).expand(B, V), p.temperature, p.top_p,
                              p.repetition_penalty, None, p.seed_lo, p.seed_hi, counter)
    assert set(got.tolist()) == {3, *tied.tolist()}


def test_a_row_draws_the_same_alone_or_in_a_batch():
    logits, p, ids, counter = rows(3, 4000, 5)
    batch = sample_vocab_triton(logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi,
                                counter)
    alone = sample_vocab_triton(logits[1:2], p.temperature[1:2], p.top_p[1:2], p.repetition_penalty[1:2], ids[1:2],
                                p.seed_lo[1:2], p.seed_hi[1:2], counter[1:2])
    assert alone.item() == batch[1].item()


def test_fp32_logits_are_refused_with_a_reason():
    logits, p, ids, counter = rows(1, 100, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match="16-bit"):
        sample_vocab_triton(logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi,
                            counter)


def cut_sweep(row, pen, ids, near):
    """One bf16 row, its window `ids` penalised by `pen`: rows with top_p just past the condition of each distinct
    value within 2 of `near` (so the cut lands on each of those values in turn) -> (top_p_cut, reference cut)."""
    row = row.to(torch.bfloat16)
    x = apply_repetition_penalty(row.float()[None], ids[None], torch.tensor([pen]))[0]
    xs, order = x.sort(descending=True)
    ps = torch.softmax(x.double(), 0)[order]
    values, counts = torch.unique_consecutive(xs, return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    cond = (torch.cumsum(ps, 0) - ps)[first] + ps[first]
    at = int((values == near).nonzero()[0])
    ks = range(max(0, at - 2), min(len(values) - 1, at + 3))
    top_p = torch.tensor([(cond[k] + 0.1 * (cond[k + 1] - cond[k])).item() for k in ks], dtype=torch.float32)
    B = len(top_p)
    got = top_p_cut(row[None].repeat(B, 1), top_p, torch.full((B,), pen), ids[None].repeat(B, 1))
    want, _ = reference_cut(x[None].repeat(B, 1), top_p)
    return got.double(), want


def test_the_cut_where_a_penalised_entry_ties_a_value_or_starts_a_span():
    # penalised values are placed among the 16-bit values by comparison: tied with two unpenalised 1.25s (2.5 / 2;
    # a fresh row's penalty 1.0 ties every window entry with its own value), and exactly on the first value of a
    # span of 2,048 keys (3.0 / 1.5 = 2.0: counted in one span only). The cut stepped across each
    g = torch.Generator().manual_seed(3)
    row = torch.rand(400, generator=g) * 2 - 4.0
    row[:6] = torch.tensor([3.0, 2.75, 2.5, 2.25, 1.5, 1.25])
    got, want = cut_sweep(row, 1.5, torch.tensor([0, 5]), 2.0)
    assert torch.equal(got, want), (got, want)
    row[10], row[11] = 1.25, 1.25
    got, want = cut_sweep(row, 2.0, torch.tensor([2, 7]), 1.25)
    assert torch.equal(got, want), (got, want)


def test_entries_around_the_floor_and_chunks_wholly_below_it():
    # The kernels count only entries at or above the row's floor, m - ln(2V / (1 - top_p)), and read no chunk whose
    # max is below the floor (counts) or below the cut (the draw). Rows: the max, a crowd of 2,047 entries 1.2-2
    # nats over the floor (enough of them that the cut lands among them: a floor 2 nats too high breaks this), and a
    # second chunk of 2,048 wholly below the floor, one of its ids in the window. top_p up to 0.998, just under
    # where the floor turns off, and 0.999, where it is off
    V = 4096
    g = torch.Generator().manual_seed(7)
    top_ps = [0.8, 0.9, 0.99, 0.998, 0.999]
    logits = torch.empty(len(top_ps), V)
    for r, top_p in enumerate(top_ps):
        floor = 8.0 - math.log(2 * V / (1 - min(top_p, 0.998)))
        logits[r, 0] = 8.0  # the row's max
        logits[r, 1:2048] = floor + 1.2 + torch.rand(2047, generator=g) * 0.8
        logits[r, 2048:] = floor - 5.0 - torch.rand(2048, generator=g)
    logits = logits.to(torch.bfloat16)
    p = SamplingTensors.from_values([(1.0, tp, 1.3, 99 + r) for r, tp in enumerate(top_ps)], "cpu")
    ids = torch.tensor([[3, 2100, 500]] * len(top_ps))
    x = apply_repetition_penalty(logits.float(), ids, p.repetition_penalty)
    want, margin = reference_cut(x, p.top_p)
    got = top_p_cut(logits, p.top_p, p.repetition_penalty, ids)
    assert (margin > 2e-6).all() and torch.equal(got.double(), want), (got, want)
    counter = torch.arange(len(top_ps), dtype=torch.int64)
    tokens, reference = both(logits, p, ids, counter)
    assert torch.equal(tokens, reference)


def test_window_ids_on_chunk_edges_are_penalised():
    # a chunk does the penalty's per-logit work only when a window id falls in its range. Row r's one window id is
    # edge r, the first or last logit of a 2,048-wide chunk (the last chunk partial), and holds the row's largest raw
    # logit, which the penalty puts below entry 100. Missed by its chunk, it would be drawn instead (top_p keeps only
    # the best)
    V = 4100
    edges = [0, 2047, 2048, 4095, 4096, 4099]
    B = len(edges)
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(8)) * 0.3 - 10.0
    logits[torch.arange(B), edges], logits[:, 100] = 4.0, 3.0
    logits = logits.to(torch.bfloat16)
    p = SamplingTensors.from_values([(0.7, 0.05, 4.0, 5 + r) for r in range(B)], "cpu")
    ids = torch.tensor(edges)[:, None]
    got = sample_vocab_triton(logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi,
                              torch.arange(B))
    assert got.tolist() == [100] * B
    assert torch.equal(top_p_cut(logits, p.top_p, p.repetition_penalty, ids), torch.full((B,), 3.0))
