"""Paged KV cache and decode attention whose cost follows each row's live context.

Keys and values live in one pool per layer, in pages of `page_size` positions; a page table maps
(row, position // page_size) to a page. Page 0 is a scratch page: rows that are idle inside a
batch bucket point at it, so their writes land nowhere that matters.

Two implementations of the decode step's write + attention, same math:
- reference: scatter the new key/value into the pool, gather each row's pages, SDPA (CPU, fp32);
- `paged_write_decode_triton`: one Triton program per (row, KV head) stores the new key/value and
  streams that row's earlier pages with an online softmax; no gather, no scan of max_seq_len; works
  inside CUDA graphs (positions are read on the device).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_support import next_pow2

SCRATCH_PAGE = 0


@dataclass
class PagedKV:
    """One layer's pools: k, v [num_pages, Hk, page_size, d]."""

    k: Tensor
    v: Tensor

    @staticmethod
    def empty(num_pages: int, n_local_heads: int, page_size: int, head_dim: int, dtype, device) -> PagedKV:
        shape = (num_pages, n_local_heads, page_size, head_dim)
        return PagedKV(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def write(self, page_table: Tensor, pos: Tensor, k: Tensor, v: Tensor) -> None:
        """page_table: int32 [B, P]; pos: int64 [B, T]; k, v: [B, T, Hk, d]. Positions < 0 are skipped
        (they go to the scratch page)."""
        page_idx = torch.div(pos.clamp(min=0), self.page_size, rounding_mode="floor")
        pages = page_table.long().gather(1, page_idx)
        pages = torch.where(pos >= 0, pages, torch.full_like(pages, SCRATCH_PAGE))
        offset = pos.clamp(min=0) % self.page_size
        self.k[pages, :, offset] = k.to(self.k.dtype)
        self.v[pages, :, offset] = v.to(self.v.dtype)

    def gather(self, page_table: Tensor) -> tuple[Tensor, Tensor]:
        """The rows' pages in position order: page_table int32 [B, P] -> k, v [B, Hk, P * page_size, d] (a copy;
        the prefill-with-history reference path, where the keys past a row's length are masked)."""
        B, P = page_table.shape
        pages = page_table.long()
        Hk, ps, d = self.k.shape[1], self.page_size, self.k.shape[3]
        k = self.k[pages].permute(0, 2, 1, 3, 4).reshape(B, Hk, P * ps, d)
        v = self.v[pages].permute(0, 2, 1, 3, 4).reshape(B, Hk, P * ps, d)
        return k, v


def write_and_attend_op():
    """-> fn(q, k, v, k_pool, v_pool, page_table, pos, use_triton): the decode step's attention. Writes
    this step's k, v [B, Hk, d] at positions pos [B], then q [B, H, d] attends over positions 0..pos
    of its row -> [B, H, d]. A registered custom op where torch has them (>= 2.4), so torch.compile
    neither traces the kernel nor copies the pools; the plain function otherwise."""
    op = _custom_op()
    return op if op is not None else _write_and_attend


def write_and_attend(q: Tensor, k: Tensor, v: Tensor, kv: PagedKV, page_table: Tensor, pos: Tensor,
                     use_triton: bool) -> Tensor:
    return write_and_attend_op()(q, k, v, kv.k, kv.v, page_table, pos, use_triton)


def _write_and_attend(q: Tensor, k: Tensor, v: Tensor, k_pool: Tensor, v_pool: Tensor, page_table: Tensor,
                      pos: Tensor, use_triton: bool) -> Tensor:
    kv = PagedKV(k_pool, v_pool)
    if use_triton:
        return paged_write_decode_triton(q, k, v, kv, page_table, pos)
    kv.write(page_table, pos[:, None], k[:, None], v[:, None])
    return paged_decode_reference(q, kv, page_table, (pos + 1).to(torch.int32))


@functools.lru_cache(maxsize=1)
def _custom_op():
    if not hasattr(torch.library, "custom_op"):  # torch < 2.4: plain function, compile stays off
        return None
    op = torch.library.custom_op("ttsengine::paged_write_and_attend", mutates_args=("k_pool", "v_pool"))(
        _write_and_attend)
    op.register_fake(lambda q, *args: torch.empty_like(q))
    # the OpOverload, not the CustomOpDef wrapper: the same call, and torch can serialize a reference
    # to it (a precompiled slow layer closes over it; engine/compile/precompiled.py)
    return torch.ops.ttsengine.paged_write_and_attend.default


def paged_decode_reference(q: Tensor, kv: PagedKV, page_table: Tensor, seq_lens: Tensor,
                           max_pages: int | None = None) -> Tensor:
    """q: [B, H, d] (one query per row); page_table: int32 [B, P]; seq_lens: int [B] keys per row
    -> [B, H, d]. Reads only the first `max_pages` pages of each row (default: all)."""
    H, Hk = q.shape[1], kv.k.shape[1]
    P = page_table.shape[1] if max_pages is None else max_pages
    k, v = kv.gather(page_table[:, :P])  # [B, Hk, P * page_size, d]
    mask = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None]  # [B, S]
    g = H // Hk
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    out = F.scaled_dot_product_attention(q[:, :, None].to(k.dtype), k, v, attn_mask=mask[:, None, None])
    return out[:, :, 0].to(q.dtype).contiguous()


@functools.lru_cache(maxsize=1)
def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(Q, KN, VN, K, V, PT, POS, OUT, scale,
               s_qb, s_qh, s_nb, s_nh, s_kp, s_kh, s_kt, s_ptb, s_ob, s_oh,
               G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
        # one program per (row b, KV head): store this step's key/value at position p, then attend
        # the G query heads of this KV head over positions 0..p-1 from the pages plus p from registers
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        p = tl.load(POS + b)
        g = tl.arange(0, BLOCK_G)
        dd = tl.arange(0, D)
        t = tl.arange(0, PAGE)
        kn = tl.load(KN + b * s_nb + kvh * s_nh + dd)
        vn = tl.load(VN + b * s_nb + kvh * s_nh + dd)
        page_w = tl.load(PT + b * s_ptb + p // PAGE).to(tl.int64)
        slot = page_w * s_kp + kvh * s_kh + (p % PAGE) * s_kt + dd
        tl.store(K + slot, kn)
        tl.store(V + slot, vn)
        q_rows = kvh * G + g
        q = tl.load(Q + b * s_qb + q_rows[:, None] * s_qh + dd[None, :], mask=(g < G)[:, None], other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        for start in range(0, p, PAGE):
            page = tl.load(PT + b * s_ptb + start // PAGE).to(tl.int64)
            base = page * s_kp + kvh * s_kh
            valid = (start + t) < p
            k = tl.load(K + base + t[:, None] * s_kt + dd[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_G, PAGE]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            pr = tl.exp(s - m_new[:, None])
            den = den * alpha + tl.sum(pr, axis=1)
            v = tl.load(V + base + t[:, None] * s_kt + dd[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v).to(tl.float32)
            m = m_new
        s_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], axis=1) * scale  # [BLOCK_G]
        m_new = tl.maximum(m, s_new)
        alpha = tl.exp(m - m_new)
        pn = tl.exp(s_new - m_new)
        den = den * alpha + pn
        acc = acc * alpha[:, None] + pn[:, None] * vn.to(tl.float32)[None, :]
        out = acc / den[:, None]
        tl.store(OUT + b * s_ob + q_rows[:, None] * s_oh + dd[None, :], out.to(OUT.dtype.element_ty),
                 mask=(g < G)[:, None])

    return kernel


def paged_write_decode_triton(q: Tensor, k: Tensor, v: Tensor, kv: PagedKV, page_table: Tensor, pos: Tensor) -> Tensor:
    """Fused: writes k, v [B, Hk, d] at positions pos [B] and attends q [B, H, d] over 0..pos -> [B, H, d].
    16-bit caches (its dot products run on tensor cores at the cache's precision)."""
    B, H, d = q.shape
    Hk = kv.k.shape[1]
    G = H // Hk
    q = q.contiguous().to(kv.k.dtype)
    k = k.contiguous().to(kv.k.dtype)
    v = v.contiguous().to(kv.k.dtype)
    out = torch.empty_like(q)
    _triton_kernel()[(B, Hk)](
        q, k, v, kv.k, kv.v, page_table, pos, out, d ** -0.5,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
        page_table.stride(0), out.stride(0), out.stride(1),
        G=G, BLOCK_G=max(16, next_pow2(G)), D=d, PAGE=kv.page_size,
    )
    return out

