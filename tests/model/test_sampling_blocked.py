"""Top-p's cumulative sum in blocks (the slow vocabulary's scan in parallel on the GPU) against the plain scan."""

from __future__ import annotations

import torch

from ttsengine.model.frame import sample_token, sample_token_blocked
from ttsengine.model.sampling import SamplingTensors, blocked_cumsum, top_p_filter


def test_blocked_cumsum_is_the_cumsum():
    g = torch.Generator().manual_seed(0)
    for V, block in ((155_776, 1024), (1000, 64), (64, 64), (7, 4)):
        x = torch.rand(3, V, generator=g, dtype=torch.float64)
        assert torch.allclose(blocked_cumsum(x, block), x.cumsum(-1), rtol=1e-12, atol=1e-12)


def test_blocked_top_p_keeps_the_same_nucleus_on_the_slow_vocabulary():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 155_776, generator=g) * 3
    top_p = torch.tensor([0.3, 0.8, 0.95, 0.99])
    kept = top_p_filter(logits, top_p, 1024) > float("-inf")
    assert torch.equal(kept, top_p_filter(logits, top_p) > float("-inf"))
    assert 0 < kept[0].sum() < kept[1].sum() < kept[2].sum() < kept[3].sum()
    # top_p 1.0: both sums pass 1.0 by rounding somewhere in the tail; they may cut it at different entries,
    # all of negligible probability
    one = torch.ones(4)
    differ = (top_p_filter(logits, one, 1024) > float("-inf")) != (top_p_filter(logits, one) > float("-inf"))
    assert (torch.softmax(logits, -1) * differ).sum(-1).max() < 1e-5


def test_blocked_sampler_draws_the_same_tokens():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 20_000, generator=g) * 2
    p = SamplingTensors.from_values([(0.8, 0.7 + 0.05 * i, 1.2, 11 + i) for i in range(6)], "cpu")
    ids = torch.randint(0, 20_000, (6, 16), generator=g)
    counter = torch.arange(6) * 10
    args = (logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
    assert torch.equal(sample_token_blocked(*args), sample_token(*args))


def test_a_trace_keeps_top_p_as_its_custom_op():
    """With the op registered (compile on), torch.compile's graph of the sampler holds ttsengine::top_p_filter, opaque
    (compat.compiling routes a trace to it; an eager call takes the function, whose result it equals)."""
    import pytest

    from ttsengine.compat import custom_ops_available
    from ttsengine.model.sampling import logits_to_probs, register_top_p_op

    if not custom_ops_available():
        pytest.skip("torch < 2.4: no custom ops")
    register_top_p_op()
    graphs = []

    def keep(gm, inputs):  # a backend that only records the graph Dynamo hands it
        graphs.append(gm)
        return gm.forward

    g = torch.Generator().manual_seed(5)
    logits, ones, top_p = torch.randn(3, 40, generator=g), torch.ones(3), torch.full((3,), 0.8)
    got = torch.compile(logits_to_probs, backend=keep, fullgraph=True)(logits, ones, top_p, ones)
    torch.testing.assert_close(got, logits_to_probs(logits, ones, top_p, ones))
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert any("top_p_filter" in t for t in targets), targets
