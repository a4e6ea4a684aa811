"""Paged decode attention: the Triton kernel (interpreted on CPU here, native on the GPU) against the
gather + SDPA reference, and both against attention over a contiguous cache."""

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
)
from ttsengine.model.kernels.triton_support import next_pow2, triton_available
from ttsengine.model.layers import attend


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
