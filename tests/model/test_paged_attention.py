"""Paged decode attention: the Triton kernel (interpreted on CPU here, native on the GPU) against the
gather + SDPA reference, and both against attention over a contiguous cache. The qkv variant (q/k-norm and
RoPE inside the kernel) against its reference, and that reference against Attention.project."""

from __future__ import annotations

import os

import pytest
import torch

from ttsengine.model.kernels.paged_attention import (
    SCRATCH_PAGE,
    PagedKV,
    paged_decode_reference,
    paged_write_decode_triton,
    write_and_attend,
    write_and_attend_qkv,
)
from ttsengine.model.kernels.triton_support import next_pow2, triton_available
from ttsengine.model.layers import Attention, attend, rope_table


def setup(B=5, H=4, Hk=2, d=32, page=16, pages=40, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    kv = PagedKV.empty(pages, Hk, page, d, dtype, device)
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    perm = torch.randperm(pages - 1, generator=g)[: B * 6].view(B, 6) + 1  # distinct, never the scratch page
    lens = torch.tensor([1, 16, 17, 50, 96][:B], dtype=torch.int32)
    q = torch.randn(B, H, d, generator=g)
    return q.to(device, dtype), kv, perm.to(device, torch.int32), lens.to(device)


def contiguous(q, kv, table, lens):
    outs = []
    for b in range(q.shape[0]):
        L = int(lens[b])
        pages = table[b].long()
        k = kv.k[pages].permute(1, 0, 2, 3).reshape(kv.k.shape[1], -1, kv.k.shape[3])[:, :L]
        v = kv.v[pages].permute(1, 0, 2, 3).reshape(kv.v.shape[1], -1, kv.v.shape[3])[:, :L]
        outs.append(attend(q[b][None, :, None], k[None], v[None], None)[0, :, 0])
    return torch.stack(outs)


def test_reference_equals_contiguous_attention():
    q, kv, table, lens = setup()
    assert torch.allclose(paged_decode_reference(q, kv, table, lens), contiguous(q, kv, table, lens), atol=1e-5)


def fused_vs_reference(q, kv, table, pos, k_new, v_new):
    ref = PagedKV(kv.k.clone(), kv.v.clone())
    ref.write(table, pos[:, None], k_new[:, None], v_new[:, None])
    want = paged_decode_reference(q, ref, table, (pos + 1).to(torch.int32))
    got = paged_write_decode_triton(q, k_new, v_new, kv, table, pos)
    return got, want, kv, ref


def _triton_major() -> int:
    import triton

    return int(triton.__version__.split(".")[0])


@pytest.mark.skipif(not triton_available() or _triton_major() < 3, reason="needs Triton >= 3 (its interpreter)")
@pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="see GPU test")
def test_triton_kernel_interpreted_equals_reference():
    for G, Hk in ((2, 2), (1, 4), (4, 1)):
        q, kv, table, lens = setup(H=G * Hk, Hk=Hk, seed=G)
        pos = lens.long() - 1
        k_new, v_new = torch.randn(5, Hk, 32), torch.randn(5, Hk, 32)
        got, want, kv, ref = fused_vs_reference(q, kv, table, pos, k_new, v_new)
        assert (got - want).abs().max() < 1e-5
        assert torch.equal(kv.k, ref.k) and torch.equal(kv.v, ref.v)  # the kernel stored the new key/value


def test_write_lands_in_the_right_page_and_skips_negative_positions():
    kv = PagedKV.empty(6, 1, 4, 2, torch.float32, "cpu")
    table = torch.tensor([[3, 5, 0], [2, 0, 0]], dtype=torch.int32)
    k = torch.arange(1, 9, dtype=torch.float32).view(2, 2, 1, 2)
    kv.write(table, torch.tensor([[1, 5], [-1, 2]]), k, k)
    assert kv.k[3, 0, 1].tolist() == [1.0, 2.0]  # row 0, position 1 -> page 3, offset 1
    assert kv.k[5, 0, 1].tolist() == [3.0, 4.0]  # row 0, position 5 -> page 5, offset 1
    assert kv.k[2, 0, 2].tolist() == [7.0, 8.0]  # row 1, position 2 -> page 2, offset 2
    assert kv.k[SCRATCH_PAGE, 0, 0].tolist() == [5.0, 6.0]  # position -1 went to scratch


def test_write_and_attend_op_matches_two_steps():
    q, kv, table, lens = setup()
    pos = lens.long() - 1
    k_new, v_new = torch.randn(5, 2, 32), torch.randn(5, 2, 32)
    ref_kv = PagedKV(kv.k.clone(), kv.v.clone())
    ref_kv.write(table, pos[:, None], k_new[:, None], v_new[:, None])
    expected = paged_decode_reference(q, ref_kv, table, lens)
    got = write_and_attend(q, k_new, v_new, kv, table, pos, use_triton=False)
    assert torch.allclose(got, expected) and torch.equal(kv.k, ref_kv.k)


def test_next_pow2_gives_the_block_extents():
    assert [next_pow2(x) for x in (0, 1, 2, 3, 16, 17, 1000, 1024)] == [1, 1, 2, 4, 16, 32, 1024, 1024]


# ---- write_and_attend_qkv: q/k-norm and RoPE inside the kernel -------------------------------------------------
EPS = 1e-6


def qkv_inputs(B, H, Hk, d, pos, norm, seed=0, dtype=torch.float32, device="cpu"):
    """One raw wqkv row per batch row [B, (H + 2 Hk) d], its RoPE rows [B, d/2, 2] (the bf16 table at pos) and
    q/k-norm weights [d] (None without norms). With norms, q and k are scaled so the norm has something to undo;
    without, all are N(0, 1) so scores stay O(1) (v always is: the output stays <= ~4)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(B, (H + 2 * Hk) * d, generator=g)
    if norm:
        qkv[:, : (H + Hk) * d] *= 3
    rope = rope_table(int(pos.max()) + 1, d, 1e6)[pos.cpu()]
    weights = [(0.5 + torch.rand(d, generator=g)).to(device, dtype) for _ in range(2)] if norm else [None, None]
    return qkv.to(device, dtype), rope.to(device), *weights


def run_qkv(qkv, rope, q_norm, k_norm, kv, table, pos, H, use_triton, splits=1):
    out = write_and_attend_qkv(qkv, rope, q_norm, k_norm, EPS, kv.k, kv.v, table, pos, H, use_triton, False,
                                    splits)
    return out, kv


@pytest.mark.skipif(not triton_available() or _triton_major() < 3, reason="needs Triton >= 3 (its interpreter)")
@pytest.mark.skipif(torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET"), reason="see GPU test")
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("d,splits", [(16, 1), (32, 1), (16, 4), (32, 2)])
def test_qkv_kernel_interpreted_equals_reference(norm, d, splits):
    # splits: a row and head's pages shared by that many programs, then the combine kernel (rows of 1-6 pages: some
    # splits have none)
    for G, Hk in ((1, 4), (2, 2), (4, 1)):
        _, kv, table, lens = setup(H=G * Hk, Hk=Hk, d=d, seed=G)
        pos = lens.long() - 1  # 0, 15, 16, 49, 95: first slot, page ends and starts
        args = qkv_inputs(5, G * Hk, Hk, d, pos, norm, seed=G + d)
        want, ref = run_qkv(*args, PagedKV(kv.k.clone(), kv.v.clone()), table, pos, G * Hk, use_triton=False)
        got, kv = run_qkv(*args, kv, table, pos, G * Hk, use_triton=True, splits=splits)
        assert got.dtype == want.dtype and (got - want).abs().max() < 1e-5, (G, d, norm)
        assert torch.equal(kv.v, ref.v)
        # without norms the rotation is the same fp32 arithmetic; with them the norm's sum runs in another order
        assert torch.equal(kv.k, ref.k) if not norm else torch.allclose(kv.k, ref.k, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_reference_is_attention_project_then_write_and_attend(dtype, qk_norm):
    # the op's reference path against the eager model's own step: bit-exact (it runs the same code)
    torch.manual_seed(0)
    B, H, Hk, d, D = 5, 4, 2, 32, 48
    att = Attention(D, H, Hk, d, qk_norm=qk_norm, norm_eps=EPS)
    if qk_norm:  # not the ones they start as: the weights must reach the math
        torch.nn.init.uniform_(att.q_norm.weight, 0.5, 1.5)
        torch.nn.init.uniform_(att.k_norm.weight, 0.5, 1.5)
    att = att.to(dtype)
    _, kv, table, lens = setup(H=H, Hk=Hk, d=d, dtype=dtype)
    pos = lens.long() - 1
    x = torch.randn(B, 1, D).to(dtype)
    rope = rope_table(int(pos.max()) + 1, d, 1e6)[pos]  # [B, d/2, 2]
    with torch.no_grad():
        q, k, v = att.project(x, rope[:, None])
        ref = PagedKV(kv.k.clone(), kv.v.clone())
        want = write_and_attend(q[:, 0], k[:, 0], v[:, 0], ref, table, pos, use_triton=False)
        norms = (att.q_norm.weight, att.k_norm.weight) if qk_norm else (None, None)
        got, kv = run_qkv(att.wqkv(x)[:, 0], rope, *norms, kv, table, pos, H, use_triton=False)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(kv.k, ref.k) and torch.equal(kv.v, ref.v)


def random_pool(B, Hk, d, page, max_len, g, dtype):
    """A CUDA pool with random contents and B rows of ceil(max_len / page) distinct pages each (never scratch)."""
    per_row = -(-max_len // page)
    kv = PagedKV.empty(B * per_row + 1, Hk, page, d, dtype, "cuda")
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    table = (torch.randperm(B * per_row, generator=g) + 1).view(B, per_row)
    return kv, table.to("cuda", torch.int32)


def written_slots(kv, table, pos):
    # bool like kv.k: the slots this step writes (row b's position pos[b])
    mask = torch.zeros(kv.k.shape, dtype=torch.bool, device=kv.k.device)
    page = table.long().gather(1, (pos // kv.page_size)[:, None])[:, 0]
    mask[page, :, pos % kv.page_size] = True
    return mask


@pytest.mark.gpu
def test_qkv_kernel_at_the_real_shapes_bf16():
    # slow layers: H 16, Hk 8, d 128 with q/k-norm, pages of 64; fast layers: d 64 without, the cache [B, Hk, 16, d]
    # as a pool of one page per row (table [B, 1] = arange(B)).
    # Output: both sides round p to bf16 for the PV product (p's exp and sums differ in the last fp32 bits) and
    # the output to bf16, where one ulp is <= 2^-7 |y|: |got - want| <= 2e-2 (the fused fast-attention test's bar for
    # the weights' differences) + 2^-7 |want| (a rounding flip), while a wrong pair, sign, head or slot is O(1).
    # Stored key, norms on: the kernel's rsqrt and sum order differ from torch's by a few fp32 ulps, so a normed
    # element near a rounding boundary can round the other way (1 bf16 ulp <= 2^-7 of it), and the weight and the
    # rotation's roundings follow; the rotation mixes the pair, so that is bounded at the pair's magnitude rho, not
    # the element's (which can cancel to ~0). Emulating rsqrt off by 1-8 fp32 ulps on CPU: about 2 * 2^-7 rho at most,
    # on <= 2e-4 of the elements; the bounds below are twice the first (2^-5 rho) and five times the second.
    g = torch.Generator().manual_seed(0)
    slow = [(B, 16, 8, 128, 64, True, torch.randint(0, 300, (B,), generator=g)) for B in (1, 37)]
    fast = [(64, 16, 8, 64, 16, False, torch.full((64,), p)) for p in (0, 1, 9, 15)]
    for B, H, Hk, d, page, norm, pos in slow + fast:
        if norm:
            kv, table = random_pool(B, Hk, d, page, 300, g, torch.bfloat16)
        else:
            kv, table = random_pool(B, Hk, d, page, page, g, torch.bfloat16)
            table = torch.arange(B, device="cuda", dtype=torch.int32)[:, None]  # row b's one page is page b
        pos = pos.cuda()
        args = qkv_inputs(B, H, Hk, d, pos, norm, seed=B + d, dtype=torch.bfloat16, device="cuda")
        want, ref = run_qkv(*args, PagedKV(kv.k.clone(), kv.v.clone()), table, pos, H, use_triton=False)
        got, kv = run_qkv(*args, kv, table, pos, H, use_triton=True)
        case = (B, d, norm)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2**-7, msg=str(case))
        assert torch.equal(kv.v, ref.v), case
        if not norm:  # the same bf16 inputs rotated in fp32 (exact products) and rounded once: bit-exact
            assert torch.equal(kv.k, ref.k), case
            continue
        written = written_slots(kv, table, pos)
        assert torch.equal(kv.k[~written], ref.k[~written]), case
        got_k, want_k = kv.k[written].float().view(-1, d), ref.k[written].float().view(-1, d)
        rho = want_k.view(-1, d // 2, 2).norm(dim=-1).repeat_interleave(2, dim=-1)
        diff = (got_k - want_k).abs()
        assert (diff <= 2**-5 * rho).all(), (case, (diff / rho).max().item())
        assert (diff > 0).float().mean().item() <= 1e-3, case


@pytest.mark.gpu
def test_qkv_kernel_replays_in_a_cuda_graph():
    # positions, qkv and rope rows change in place between replays; the replay equals a direct call
    g = torch.Generator().manual_seed(1)
    B, H, Hk, d = 8, 16, 8, 128
    kv, table = random_pool(B, Hk, d, 64, 200, g, torch.bfloat16)
    pos = torch.randint(0, 150, (B,), generator=g).cuda()
    qkv, rope, q_norm, k_norm = qkv_inputs(B, H, Hk, d, pos, True, dtype=torch.bfloat16, device="cuda")
    full_rope = rope_table(200, d, 1e6).cuda()

    def step(k_pool, v_pool):
        return write_and_attend_qkv(qkv, rope, q_norm, k_norm, EPS, k_pool, v_pool, table, pos, H, True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(kv.k, kv.v)  # compiles the kernel before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step(kv.k, kv.v)
    for shift in (1, 7, 40):
        pos.add_(shift)
        qkv.copy_(torch.randn(qkv.shape, generator=g).to("cuda", qkv.dtype) * 3)
        rope.copy_(full_rope[pos])
        before = PagedKV(kv.k.clone(), kv.v.clone())
        graph.replay()
        want = step(before.k, before.v)
        assert torch.equal(y, want), shift
        assert torch.equal(kv.k, before.k) and torch.equal(kv.v, before.v), shift


def real_slow_inputs(B, ctx, g):
    """The real slow attention's shapes on the GPU (16 heads, 8 KV heads of 128, pages of 64, q/k norms), bf16: pool,
    table, positions in [ctx / 2, ctx), and qkv_inputs' (qkv, rope, q_norm, k_norm)."""
    kv, table = random_pool(B, 8, 128, 64, ctx + 70, g, torch.bfloat16)
    pos = torch.randint(ctx // 2, ctx, (B,), generator=g).cuda()
    return kv, table, pos, qkv_inputs(B, 16, 8, 128, pos, True, dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
def test_pipelined_page_loop_equals_the_plain_loop(monkeypatch):
    # the page loop software-pipelined (paged_attention.PIPELINE_STAGES, loads of later pages in flight) is the same
    # math in the same order: bit-equal outputs and pools, 1-64 rows, contexts within a page to many pages
    from ttsengine.model.kernels import paged_attention as pa

    g = torch.Generator().manual_seed(2)
    H = 16
    for B, ctx in ((1, 30), (2, 150), (8, 700), (64, 300)):
        kv, table, pos, (qkv, rope, q_norm, k_norm) = real_slow_inputs(B, ctx, g)
        results = []
        for stages in (1, 2):
            monkeypatch.setattr(pa, "PIPELINE_STAGES", stages)
            pools = PagedKV(kv.k.clone(), kv.v.clone())
            out = pa.paged_write_decode_qkv_triton(qkv, rope, q_norm, k_norm, EPS, pools, table, pos, H)
            results.append((out, pools))
        (a, pa_), (b, pb) = results
        assert torch.equal(a, b) and torch.equal(pa_.k, pb.k) and torch.equal(pa_.v, pb.v), (B, ctx)


@pytest.mark.gpu
def test_split_pages_close_to_one_program_per_head():
    # split_attention: each row and head's pages shared by 2-8 programs, then the combine kernel; other fp32 sums
    # than one program's, so ulps apart in bf16; the pools are the same bits (only split 0 writes)
    from ttsengine.model.kernels import paged_attention as pa

    g = torch.Generator().manual_seed(3)
    H = 16
    for B, ctx in ((1, 30), (1, 700), (2, 150), (4, 2000)):
        kv, table, pos, (qkv, rope, q_norm, k_norm) = real_slow_inputs(B, ctx, g)
        one = PagedKV(kv.k.clone(), kv.v.clone())
        want = pa.paged_write_decode_qkv_triton(qkv, rope, q_norm, k_norm, EPS, one, table, pos, H).float()
        for splits in (2, 4, 8):
            pools = PagedKV(kv.k.clone(), kv.v.clone())
            got = pa.paged_write_decode_qkv_triton(qkv, rope, q_norm, k_norm, EPS, pools, table, pos, H, False,
                                                   splits).float()
            assert (got - want).abs().max().item() <= 2 ** -6 * want.abs().max().item(), (B, ctx, splits)
            assert torch.equal(pools.k, one.k) and torch.equal(pools.v, one.v), (B, ctx, splits)
