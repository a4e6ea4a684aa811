"""Paged KV cache and decode attention whose cost follows each row's live context.

Keys and values live in one pool per layer, in pages of `page_size` positions; a page table maps
(row, position // page_size) to a page. Page 0 is a scratch page: rows that are idle inside a
batch bucket point at it, so their writes land nowhere that matters.

Two implementations of the decode step's write + attention, same math:
- reference: scatter the new key/value into the pool, gather each row's pages, SDPA (CPU, fp32);
- `paged_write_decode_triton`: one Triton program per (row, KV head) stores the new key/value and
  streams that row's earlier pages with an online softmax; no gather, no scan of max_seq_len; works
  inside CUDA graphs (positions are read on the device).

`write_and_attend_qkv` is the same step from the raw wqkv output: the kernel also applies the per-head
q/k RMSNorm and RoPE (Attention.project's math and roundings), so a layer launches no separate kernels for them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layers import apply_rope, rms_norm
from .launch import gdc_ops, launch_options
from .triton_support import next_pow2, triton_major

SCRATCH_PAGE = 0
# > 1: the Triton kernel's page loop software-pipelined with this many stages (tl.range num_stages: later pages'
# loads in flight while one is used); 1: one page after the other. The same math in the same order either way
# (bit-equal, tested on the device). 2 measured faster at short and long contexts, 3 and 4 gain nothing
# (scripts/device/attention_bench.py; docs/performance.md, "Paged attention")
PIPELINE_STAGES = 2


def _stages() -> int:
    # tl.range(num_stages=) is Triton 3's: an older Triton (torch 2.2's, which also runs this kernel) walks the pages
    # one after the other
    return PIPELINE_STAGES if triton_major() >= 3 else 1


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
    return op if op is not None else write_and_attend_eager


def write_and_attend(q: Tensor, k: Tensor, v: Tensor, kv: PagedKV, page_table: Tensor, pos: Tensor,
                     use_triton: bool) -> Tensor:
    return write_and_attend_eager(q, k, v, kv.k, kv.v, page_table, pos, use_triton)


def write_and_attend_eager(q: Tensor, k: Tensor, v: Tensor, k_pool: Tensor, v_pool: Tensor, page_table: Tensor,
                           pos: Tensor, use_triton: bool) -> Tensor:
    """write_and_attend_op's step as a function (what its op registers), called where nothing traces it
    (compat.compiling): the op's wrapper would import torch._dynamo at its first call."""
    kv = PagedKV(k_pool, v_pool)
    if use_triton:
        return paged_write_decode_triton(q, k, v, kv, page_table, pos)
    kv.write(page_table, pos[:, None], k[:, None], v[:, None])
    return paged_decode_reference(q, kv, page_table, (pos + 1).to(torch.int32))


def write_and_attend_qkv(qkv: Tensor, rope: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
                         k_pool: Tensor, v_pool: Tensor, page_table: Tensor, pos: Tensor, n_head: int,
                         use_triton: bool, pdl: bool = False, splits: int = 1) -> Tensor:
    """The decode step's attention from the raw wqkv output -> y [B, H, d]. qkv: [B, (H + 2 * Hk) * d], one position
    per row, split q | k | v head-major as Attention.project splits it (H = n_head; Hk, d from k_pool); rope:
    [B, d/2, 2] (cos, sin) at each row's position; q_norm, k_norm: per-head RMSNorm weights [d], both or neither
    (None). Normalises and rotates q and k as Attention.project does, then is write_and_attend_op's step (pdl: the
    Triton kernel launched as a programmatic dependent where that runs, kernels/launch.py; splits: its pages shared
    by that many programs per row and head, paged_write_decode_qkv_triton). A plain function, no custom op: only the
    fused layers call it, which nothing traces (they run eager or in CUDA graphs; an op's first call would import
    torch._dynamo)."""
    if use_triton:
        return paged_write_decode_qkv_triton(qkv, rope, q_norm, k_norm, eps, PagedKV(k_pool, v_pool), page_table,
                                             pos, n_head, pdl, splits)
    # the reference is the eager model's own code, so it is Attention.project's math by construction
    q, k, v = _split_heads(qkv, n_head, k_pool.shape[1], k_pool.shape[3])  # [B, 1, H | Hk, d]
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    q, k = apply_rope(q, rope[:, None]), apply_rope(k, rope[:, None])
    return write_and_attend_eager(q[:, 0], k[:, 0], v[:, 0], k_pool, v_pool, page_table, pos, False)


def _split_heads(qkv: Tensor, n_head: int, n_kv: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    # qkv: [B, (H + 2 * Hk) * d] -> q [B, 1, H, d], k, v [B, 1, Hk, d] (views, as Attention.project makes them)
    B = qkv.shape[0]
    q, k, v = qkv.split([n_head * d, n_kv * d, n_kv * d], dim=-1)
    return q.view(B, 1, n_head, d), k.view(B, 1, n_kv, d), v.view(B, 1, n_kv, d)


def _qkv_out_dtype(qkv: Tensor, q_norm: Tensor | None) -> torch.dtype:
    # q after rms_norm is (normed q in qkv's dtype) * weight: torch's promotion of the two dtypes
    return qkv.dtype if q_norm is None else torch.promote_types(qkv.dtype, q_norm.dtype)


@functools.lru_cache(maxsize=1)
def _custom_op():
    return _register_op("paged_write_and_attend", write_and_attend_eager, lambda q, *args: torch.empty_like(q))


def _register_op(name: str, fn, fake):
    if not hasattr(torch.library, "custom_op"):  # torch < 2.4: plain function, compile stays off
        return None
    op = torch.library.custom_op(f"ttsengine::{name}", mutates_args=("k_pool", "v_pool"))(fn)
    op.register_fake(fake)
    # the OpOverload, not the CustomOpDef wrapper: the same call, and torch can serialize a reference
    # to it (a precompiled slow layer closes over it; engine/device/compile/precompiled.py)
    return getattr(torch.ops.ttsengine, name).default


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

    gdc_wait, gdc_launch_dependents = gdc_ops()

    @triton.jit
    def _page(q, K, V, PT, b, s_ptb, s_kp, s_kh, s_kt, kvh, start, p, t, dd, scale, m, den, acc, PAGE: tl.constexpr):
        # one page of the row's earlier positions into the online softmax (m, den [BLOCK_G], acc [BLOCK_G, D])
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
        return m_new, den, acc

    globals()["_page"] = _page  # Triton's interpreter (CPU tests) looks a kernel's jitted callees up in its globals

    @triton.jit
    def kernel(Q, KN, VN, K, V, PT, POS, OUT, scale,
               s_qb, s_qh, s_nb, s_nh, s_kp, s_kh, s_kt, s_ptb, s_ob, s_oh,
               G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
               ROT=None, QW=None, KW=None, eps=0.0, s_rb=0, s_rj=0, s_rc=0,
               ROPE: tl.constexpr = False, QK_NORM: tl.constexpr = False, PDL: tl.constexpr = False,
               STAGES: tl.constexpr = 1, PART=None, SPLITS: tl.constexpr = 1):
        # one program per (row b, KV head): store this step's key/value at position p, then attend
        # the G query heads of this KV head over positions 0..p-1 from the pages plus p from registers.
        # SPLITS > 1: program (b, head, s) takes pages s, s + SPLITS, ... and writes its softmax state (max, sum,
        # weighted values) to PART for _combine; split 0 also stores the new key/value and adds position p.
        # ROPE: Q, KN, VN are the raw wqkv output; q and the new key are first normalised (QK_NORM) and rotated
        # here with Attention.project's roundings (16-bit after the norm, after the weight, after the rotation)
        if PDL:  # launched as a programmatic dependent (launch.py): everything here reads the previous kernel's output
            gdc_wait()
            gdc_launch_dependents()
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        p = tl.load(POS + b)
        g = tl.arange(0, BLOCK_G)
        dd = tl.arange(0, D)
        t = tl.arange(0, PAGE)
        q_rows = kvh * G + g
        q_at = Q + b * s_qb + q_rows[:, None] * s_qh
        if ROPE:
            # pair (2j, 2j+1) rotates by (cos_j, sin_j): element i reads its partner i ^ 1, and the even one
            # subtracts (a cos - b sin, b cos + a sin); loading both orders avoids a join/reshape to interleave
            partner = dd ^ 1
            cos = tl.load(ROT + b * s_rb + (dd // 2) * s_rj).to(tl.float32)
            sin = tl.load(ROT + b * s_rb + (dd // 2) * s_rj + s_rc).to(tl.float32)
            sin = tl.where(dd % 2 == 0, -sin, sin)
            qm = (g < G)[:, None]
            q = tl.load(q_at + dd[None, :], mask=qm, other=0.0).to(tl.float32)  # [BLOCK_G, D], qkv's values
            q2 = tl.load(q_at + partner[None, :], mask=qm, other=0.0).to(tl.float32)
            kn = tl.load(KN + b * s_nb + kvh * s_nh + dd).to(tl.float32)  # [D]
            k2 = tl.load(KN + b * s_nb + kvh * s_nh + partner).to(tl.float32)
            if QK_NORM:
                # rms_norm: fp32 mean of squares over the head, rounded to qkv's dtype, then times the weight (exact
                # in fp32 for 16-bit factors) rounded once to OUT's dtype, torch's promotion of the two as in
                # `y * weight`; padded heads are 0 and stay 0
                rq = tl.math.rsqrt(tl.sum(q * q, axis=1) / D + eps)[:, None]
                rk = tl.math.rsqrt(tl.sum(kn * kn, axis=0) / D + eps)
                q = (q * rq).to(Q.dtype.element_ty).to(tl.float32) * tl.load(QW + dd).to(tl.float32)[None, :]
                q2 = (q2 * rq).to(Q.dtype.element_ty).to(tl.float32) * tl.load(QW + partner).to(tl.float32)[None, :]
                kn = (kn * rk).to(Q.dtype.element_ty).to(tl.float32) * tl.load(KW + dd).to(tl.float32)
                k2 = (k2 * rk).to(Q.dtype.element_ty).to(tl.float32) * tl.load(KW + partner).to(tl.float32)
                q = q.to(OUT.dtype.element_ty).to(tl.float32)
                q2 = q2.to(OUT.dtype.element_ty).to(tl.float32)
                kn = kn.to(OUT.dtype.element_ty).to(tl.float32)
                k2 = k2.to(OUT.dtype.element_ty).to(tl.float32)
            # apply_rope: fp32 from the 16-bit values (the products are exact, so FMA contraction changes
            # nothing), rounded to q's dtype (OUT's), then to the cache's as the write and the attention cast
            q = (q * cos[None, :] + q2 * sin[None, :]).to(OUT.dtype.element_ty).to(K.dtype.element_ty)
            kn = (kn * cos + k2 * sin).to(OUT.dtype.element_ty).to(K.dtype.element_ty)
            vn = tl.load(VN + b * s_nb + kvh * s_nh + dd).to(V.dtype.element_ty)
        else:
            kn = tl.load(KN + b * s_nb + kvh * s_nh + dd)
            vn = tl.load(VN + b * s_nb + kvh * s_nh + dd)
            q = tl.load(q_at + dd[None, :], mask=(g < G)[:, None], other=0.0)
        split = tl.program_id(2)
        if split == 0:
            page_w = tl.load(PT + b * s_ptb + p // PAGE).to(tl.int64)
            slot = page_w * s_kp + kvh * s_kh + (p % PAGE) * s_kt + dd
            tl.store(K + slot, kn)
            tl.store(V + slot, vn)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        if STAGES > 1:  # software-pipelined: the next pages' loads are in flight while this one is used
            for start in tl.range(split * PAGE, p, SPLITS * PAGE, num_stages=STAGES):
                m, den, acc = _page(q, K, V, PT, b, s_ptb, s_kp, s_kh, s_kt, kvh, start, p, t, dd, scale, m, den, acc,
                                    PAGE)
        else:
            for start in range(split * PAGE, p, SPLITS * PAGE):
                m, den, acc = _page(q, K, V, PT, b, s_ptb, s_kp, s_kh, s_kt, kvh, start, p, t, dd, scale, m, den, acc,
                                    PAGE)
        if split == 0:
            s_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], axis=1) * scale  # [BLOCK_G]
            m_new = tl.maximum(m, s_new)
            alpha = tl.exp(m - m_new)
            pn = tl.exp(s_new - m_new)
            den = den * alpha + pn
            acc = acc * alpha[:, None] + pn[:, None] * vn.to(tl.float32)[None, :]
            m = m_new
        if SPLITS > 1:  # PART [B, Hk, SPLITS, BLOCK_G, D + 2]: weighted values, then max and sum
            at = PART + (((b * tl.num_programs(1) + kvh) * SPLITS + split) * BLOCK_G + g[:, None]) * (D + 2)
            real = (g < G)[:, None]  # padded query heads are neither stored nor combined
            tl.store(at + dd[None, :], acc, mask=real)
            tl.store(at + D, m[:, None], mask=real)
            tl.store(at + D + 1, den[:, None], mask=real)
        else:
            out = acc / den[:, None]
            tl.store(OUT + b * s_ob + q_rows[:, None] * s_oh + dd[None, :], out.to(OUT.dtype.element_ty),
                     mask=(g < G)[:, None])

    return kernel


@functools.lru_cache(maxsize=1)
def _combine_kernel():
    import triton
    import triton.language as tl

    gdc_wait, gdc_launch_dependents = gdc_ops()

    @triton.jit
    def combine(PART, OUT, s_ob, s_oh, G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                SPLITS: tl.constexpr, PDL: tl.constexpr = False):
        # one program per (row, KV head): the splits' softmax states -> the G heads' outputs
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        b, kvh = tl.program_id(0), tl.program_id(1)
        sp = tl.arange(0, SPLITS)
        g = tl.arange(0, BLOCK_G)
        dd = tl.arange(0, D)
        at = PART + (((b * tl.num_programs(1) + kvh) * SPLITS + sp[:, None]) * BLOCK_G + g[None, :]) * (D + 2)
        real = (g < G)[None, :]  # padded query heads: 0s, never stored
        m = tl.load(at + D, mask=real, other=0.0)  # [SPLITS, BLOCK_G]; -inf where a split had no page
        den = tl.load(at + D + 1, mask=real, other=1.0)
        top = tl.max(m, axis=0)  # split 0 always holds position p: finite
        w = tl.exp(m - top[None, :])
        acc = tl.load(at[:, :, None] + dd[None, None, :], mask=real[:, :, None], other=0.0)
        acc = tl.sum(acc * w[:, :, None], axis=0)  # [BLOCK_G, D]
        out = acc / tl.sum(den * w, axis=0)[:, None]
        tl.store(OUT + b * s_ob + (kvh * G + g)[:, None] * s_oh + dd[None, :], out.to(OUT.dtype.element_ty),
                 mask=(g < G)[:, None])

    return combine


def attention_splits(rows: int, kv_heads: int, pages_per_row: int, most: int) -> int:
    """How many programs share a (row, KV head)'s pages: enough that rows x heads x splits fills ~128 programs (a
    few rows leave most of the GPU idle while each program walks its pages in turn), at most `most` and the table's
    pages per row (a power of two: the combine kernel's extent); 1 when the rows alone fill it."""
    splits = 1
    while splits * 2 <= min(most, pages_per_row) and rows * kv_heads * splits * 2 <= 128:
        splits *= 2
    return splits


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
        G=G, BLOCK_G=max(16, next_pow2(G)), D=d, PAGE=kv.page_size, STAGES=_stages(),
    )
    return out


def paged_write_decode_qkv_triton(qkv: Tensor, rope: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
                                  kv: PagedKV, page_table: Tensor, pos: Tensor, n_head: int,
                                  pdl: bool = False, splits: int = 1) -> Tensor:
    """paged_write_decode_triton from the raw wqkv output qkv [B, (H + 2 * Hk) * d]: the kernel normalises
    (q_norm, k_norm [d] or None) and rotates (rope [B, d/2, 2]) q and k itself -> [B, H, d] in the dtype
    Attention.project's q has. 16-bit caches. `pdl`: launched as a programmatic dependent where that runs
    (launch.launch_options). `splits` > 1 (a power of two): each (row, KV head)'s pages shared by that many programs,
    then one combine kernel (other sums than one program's: ulps apart)."""
    B = qkv.shape[0]
    Hk, d = kv.k.shape[1], kv.k.shape[3]
    G = n_head // Hk
    qkv = qkv.contiguous()
    q, k, v = qkv.split([n_head * d, Hk * d, Hk * d], dim=-1)  # views: the kernel reads each at its offset
    norm = q_norm is not None
    if norm and q_norm.dtype != k_norm.dtype:  # the kernel rounds normed q and k to one dtype, OUT's
        raise ValueError(f"q_norm is {q_norm.dtype} but k_norm is {k_norm.dtype}")
    out = torch.empty((B, n_head, d), dtype=_qkv_out_dtype(qkv, q_norm), device=qkv.device)
    block_g = max(16, next_pow2(G))
    part = torch.empty((B, Hk, splits, block_g, d + 2), dtype=torch.float32, device=qkv.device) if splits > 1 else None
    _triton_kernel()[(B, Hk, splits)](
        q, k, v, kv.k, kv.v, page_table, pos, out, d ** -0.5,
        qkv.stride(0), d, qkv.stride(0), d, kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
        page_table.stride(0), out.stride(0), out.stride(1),
        G=G, BLOCK_G=block_g, D=d, PAGE=kv.page_size,
        ROT=rope, QW=q_norm.contiguous() if norm else None, KW=k_norm.contiguous() if norm else None, eps=eps,
        s_rb=rope.stride(0), s_rj=rope.stride(1), s_rc=rope.stride(2), ROPE=True, QK_NORM=norm,
        STAGES=_stages(), PART=part, SPLITS=splits, **launch_options(pdl, qkv.device),
    )
    if splits > 1:
        _combine_kernel()[(B, Hk)](part, out, out.stride(0), out.stride(1), G=G, BLOCK_G=block_g, D=d, SPLITS=splits,
                                   **launch_options(pdl, qkv.device))
    return out
