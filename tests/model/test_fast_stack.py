"""fast_stack, every fast layer at one codebook position in one persistent kernel (interpreted on CPU here, one
program; native on the GPU with one program per SM and grid barriers: marker `gpu`), against the fast layers' own
eager forward over a masked cache, position after position as a frame runs them; stacking keeps the modules'
forward unchanged."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from ttsengine.model.fast_stack import make_fast_stack, stack_fast_layers
from ttsengine.model.frame import fast_layer_step
from ttsengine.model.kernels.fast_stack import FastStackConfig, fast_stack
from ttsengine.model.kernels.triton_support import triton_available, triton_major
from ttsengine.model.layers import TransformerBlock, causal_mask_from_positions, rope_table
from ttsengine.model.quant import Int8Linear

interpreted = pytest.mark.skipif(not triton_available() or triton_major() < 3,
                                 reason="needs Triton >= 3 (its interpreter)")
cpu_only = pytest.mark.skipif(torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                              reason="the native kernel: see the gpu tests")


class Fast(nn.Module):
    """Stands in for DualAR: what stack_fast_layers reads (fast_layers)."""

    def __init__(self, n_layer, dim, n_head, n_kv, head_dim, hidden, qk_norm, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fast_layers = nn.ModuleList(
            TransformerBlock(dim, n_head, n_kv, head_dim, hidden, qkv_bias=False, o_bias=False, qk_norm=qk_norm,
                             norm_eps=1e-6) for _ in range(n_layer))
        for p in self.parameters():  # weights ~ 1/sqrt(fan-in), norms near 1: activations stay O(1)
            if p.dim() == 2:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
            else:
                nn.init.normal_(p, mean=1.0, std=0.2)

    def prepare(self, dtype, device, int8=False):
        self.to(device, dtype)
        for layer in self.fast_layers:
            if int8:
                for owner, name in ((layer.attention, "wqkv"), (layer.attention, "wo"), (layer.feed_forward, "w1"),
                                    (layer.feed_forward, "w3"), (layer.feed_forward, "w2")):
                    setattr(owner, name, Int8Linear(getattr(owner, name), "dequant"))
                assert layer.feed_forward.merge_int8_inputs()
            else:
                assert layer.feed_forward.merge_inputs()
        return self


SMALL = dict(n_layer=2, dim=64, n_head=4, n_kv=2, head_dim=16, hidden=192)  # the golden_realflags fast shapes
REAL = dict(n_layer=4, dim=1024, n_head=16, n_kv=8, head_dim=64, hidden=3072)  # S1-mini's


def run_both(model, M, n, dtype, device, config=None, seed=1):
    """-> (kernel outputs, eager outputs): [n] of [M, D], positions 0..n-1, each position's input the eager
    output of the one before plus noise (as a frame feeds codebook embeddings)."""
    g = torch.Generator().manual_seed(seed)
    layers = model.fast_layers
    a0 = layers[0].attention
    D, Hk, d = layers[0].attention_norm.weight.shape[0], a0.n_local_heads, a0.head_dim
    weights = stack_fast_layers(model)
    assert weights is not None
    ropes = rope_table(n, d, 1e6, device)  # [n, d/2, 2]
    L = n
    kc = torch.full((len(layers), M, Hk, L, d), float("nan"), dtype=dtype, device=device)  # unread positions: NaN
    vc = kc.clone()
    ek = [torch.zeros(M, Hk, L, d, dtype=dtype, device=device) for _ in layers]
    ev = [torch.zeros_like(c) for c in ek]
    got, want = [], []
    x = (torch.randn(M, D, generator=g) * 2).to(device, dtype)
    for k in range(n):
        rope = ropes[k].expand(M, *ropes.shape[1:])
        got.append(fast_stack(x, weights, kc, vc, rope, k, config))
        pos = torch.full((M, 1), k, device=device)
        mask = causal_mask_from_positions(pos, L)
        y = x[:, None]
        for layer, ck, cv in zip(layers, ek, ev):
            y = fast_layer_step(layer, y, rope[:, None], ck, cv, pos, mask)
        want.append(y[:, 0])
        x = y[:, 0] + torch.randn(M, D, generator=g).to(device, dtype)
    return got, want


def assert_close(got, want, dtype, rel):
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.isfinite(a).all(), k
        err = (a.float() - b.float()).abs().max().item()
        mag = b.float().abs().max().item()
        assert err <= rel * mag, (k, err, mag)


@interpreted
@cpu_only
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("M", [1, 2])
def test_interpreted_equals_eager_fp32(M, qk_norm):
    model = Fast(**SMALL, qk_norm=qk_norm).prepare(torch.float32, "cpu")
    got, want = run_both(model, M, 4, torch.float32, "cpu")
    assert_close(got, want, torch.float32, 2e-5)


@interpreted
@cpu_only
def test_interpreted_bf16_and_int8():
    # bf16: every step rounds where the eager ops round; what differs is the fp32 summation order and the softmax
    # (fp32 probabilities here, SDPA's own), a few bf16 ulps that grow through 2 layers x 4 positions: 3% of the
    # output's magnitude bounds it with a wide margin and still fails on any missing term (a layer, a head, a key)
    model = Fast(**SMALL, qk_norm=False).prepare(torch.bfloat16, "cpu")
    got, want = run_both(model, 2, 4, torch.bfloat16, "cpu")
    assert_close(got, want, torch.bfloat16, 0.03)
    model = Fast(**SMALL, qk_norm=False, seed=3).prepare(torch.float32, "cpu", int8=True)
    got, want = run_both(model, 2, 4, torch.float32, "cpu")
    assert_close(got, want, torch.float32, 2e-5)


@interpreted
@cpu_only
def test_stacking_keeps_the_modules_forward():
    model = Fast(**SMALL, qk_norm=True).prepare(torch.float32, "cpu")
    layer = model.fast_layers[1]
    x = torch.randn(2, 1, 64)
    rope = rope_table(4, 16, 1e6)[1].expand(2, 8, 2)[:, None]
    pos = torch.ones(2, 1, dtype=torch.long)
    mask = causal_mask_from_positions(pos, 4)

    def out():
        ck = torch.zeros(2, 2, 4, 16)
        return fast_layer_step(layer, x, rope, ck, torch.zeros_like(ck), pos, mask)

    before = out()
    w = stack_fast_layers(model)
    assert w.wqkv.shape == (2, 128, 64) and w.w13.shape == (2, 384, 64) and w.q_norm.shape == (2, 16)
    assert layer.attention.wqkv.weight.data_ptr() == w.wqkv[1].data_ptr()  # a view, no second copy
    assert layer.feed_forward.w3.weight.data_ptr() == w.w13[1, 192:].data_ptr()
    assert torch.equal(out(), before)
    fn = make_fast_stack(w)
    kc = torch.zeros(2, 2, 2, 4, 16)
    assert fn(x, rope[:, 0], kc, kc.clone(), 0).shape == (2, 1, 64)


def test_unsupported_layers_are_left_alone():
    model = Fast(**SMALL, qk_norm=False)  # W1|W3 not merged: nothing stacked, nothing changed
    ptr = model.fast_layers[0].attention.wqkv.weight.data_ptr()
    assert stack_fast_layers(model) is None
    assert model.fast_layers[0].attention.wqkv.weight.data_ptr() == ptr


@interpreted
@cpu_only
def test_bad_arguments_raise():
    model = Fast(**SMALL, qk_norm=False).prepare(torch.float32, "cpu")
    w = stack_fast_layers(model)
    x = torch.randn(3, 64)
    kc = torch.zeros(2, 3, 2, 4, 16)
    with pytest.raises(ValueError, match="1..2 rows"):
        fast_stack(x, w, kc, kc, torch.zeros(3, 8, 2), 0)
    with pytest.raises(ValueError, match="does not fit"):
        fast_stack(x[:2], w, kc[:, :2], kc[:, :2], torch.zeros(2, 8, 2), 4)


# ---- native, on the device ------------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("M", [1, 2])
def test_native_real_shapes(M, int8):
    # the S1-mini fast stack, one program per SM and 5 grid barriers a layer, 10 positions; bound as the
    # interpreted bf16 test's (4 layers here: a little more drift)
    model = Fast(**REAL, qk_norm=False).prepare(torch.bfloat16, "cuda", int8=int8)
    got, want = run_both(model, M, 10, torch.bfloat16, "cuda")
    assert_close(got, want, torch.bfloat16, 0.05)


@pytest.mark.gpu
@gpu
def test_native_fp32_and_qk_norm_tight():
    model = Fast(**REAL, qk_norm=True).prepare(torch.float32, "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    got, want = run_both(model, 2, 10, torch.float32, "cuda")
    assert_close(got, want, torch.float32, 1e-4)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("config", [FastStackConfig(), FastStackConfig(grid=96), FastStackConfig(num_warps=4)],
                         ids=["default", "grid96", "warps4"])
def test_native_rows_independent_and_repeatable(config):
    # a row's bits alone == in a pair (the CUDA-core tiles loop over rows), and the barrier leaves its words ready
    # for the next launch (100 launches in a row, the same bits each time)
    model = Fast(**REAL, qk_norm=False).prepare(torch.bfloat16, "cuda")
    w = stack_fast_layers(model)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    rope = rope_table(10, 64, 1e6, "cuda")[3].expand(2, 32, 2)
    kc = torch.randn(4, 2, 8, 10, 64, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    pair = fast_stack(x, w, kc.clone(), vc.clone(), rope, 3, config)
    alone = fast_stack(x[:1], w, kc[:, :1].clone(), vc[:, :1].clone(), rope[:1], 3, config)
    assert torch.equal(pair[:1], alone)
    outs = [fast_stack(x, w, kc.clone(), vc.clone(), rope, 3, config) for _ in range(100)]
    assert all(torch.equal(o, pair) for o in outs)
    assert w.sync[0].item() == 0


@interpreted
@cpu_only
def test_kernel_runs_only_on_cuda_or_the_interpreter(monkeypatch):
    # the runner turns fast_stack on only where its kernel runs: a CPU engine without Triton's interpreter keeps
    # layer_gemv's path (whose small_linear falls back to torch there) instead of failing every step
    from ttsengine.model.fast_stack import kernel_runs
    from ttsengine.model.kernels import small_linear

    assert kernel_runs(torch.device("cpu"))  # interpreted here
    monkeypatch.setattr(small_linear, "_interpreted", lambda: False)
    assert not kernel_runs(torch.device("cpu"))
