"""The fast transformer's layers at one codebook position as ONE persistent Triton kernel, for 1-2 rows
(TTS_FEATURES=+fast_stack, opt-in).

At one or two streams each fast layer is five kernels of a few microseconds (layer_gemv: model/fused_layer.py),
and a frame runs 10 positions x 4 layers of them: ~200 launches whose fixed costs, not their 96 MB of weights per
position, set the time. Here every program of one launch (one per SM) walks the same phases,

    per layer:  qkv = rms_norm(x) @ Wqkv  |  attention (RoPE, cache write)  |  h = x + y @ Wo
                |  g = silu(n @ W1) * (n @ W3), n = rms_norm(h)  |  x = h + g @ W2

taking tiles of each phase round-robin and meeting the others at a grid barrier between phases (the next phase
reads what all of them wrote). A linear tile loads its weight rows first, then the activations (".cg", past L1:
other SMs wrote them in this launch), and rounds where small_linear rounds (norm, product, scale, residual or
SwiGLU); the attention tile is one (row, KV head): q/k RMSNorm and RoPE as Attention.project rounds them, the new
key/value stored at `pos`, softmax over positions 0..pos in fp32.

Measured slower per position than layer_gemv's kernels (scripts/device/fast_stack_bench.py; docs/performance.md,
"Fused decode-step kernels"): the grid barriers (21 a position) cost a third of the gap and a program's tiles run
as a chain of dependent loads and block reductions. Hence opt-in. What would make it pay: weights of the next
phase loaded before the barrier (held in registers they spilled, slower still; they need shared memory),
attention folded into the Wo phase (one barrier fewer per layer), fewer, cheaper barriers.

Barrier: a self-resetting counter + generation word (`sync`, int32 [2], zero at first use, left as it was found
modulo the generation). Every program must be resident at once, so the grid is at most one program per SM (checked)
and a program's registers and shared memory are meant to stay under half an SM's (not checked: measured configs
only), so an SM shared with the codec's kernels still takes ours. Not safe where the process sees fewer SMs than the
device reports (MPS with an active-thread limit): the programs would spin forever. Hence opt-in only. Triton's
interpreter (CPU tests) runs programs one after another: there the grid is one program and the barrier a no-op.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from . import small_linear
from .triton_support import next_pow2

MAX_ROWS = 2  # the CUDA-core tiles' row class (small_linear.CORE_ROWS): a row's bits are the same alone or paired


@dataclass(frozen=True)
class FastStackConfig:
    """One launch's shape: programs (0: one per SM), output columns per tile of each linear (tiles go round-robin
    over the programs) and warps per program."""

    grid: int = 0
    bn_qkv: int = 16
    bn_o: int = 8
    bn_13: int = 8
    bn_2: int = 8
    num_warps: int = 8


@dataclass(frozen=True)
class FastStackWeights:
    """The fast layers' weights stacked on a leading layer axis (model/fast_stack.py makes them; the modules' own
    weights are views of these). int8: the *_scale fp32 [NL, N]; 16-bit: None."""

    wqkv: Tensor  # [NL, (H + 2 Hk) d, D]
    wo: Tensor  # [NL, D, H d]
    w13: Tensor  # [NL, 2 F, D]  (W1 | W3)
    w2: Tensor  # [NL, D, F]
    attention_norm: Tensor  # [NL, D]
    ffn_norm: Tensor  # [NL, D]
    q_norm: Tensor | None  # [NL, d], with k_norm, or both None
    k_norm: Tensor | None
    wqkv_scale: Tensor | None
    wo_scale: Tensor | None
    w13_scale: Tensor | None
    w2_scale: Tensor | None
    n_head: int
    n_local_heads: int
    head_dim: int
    eps: float  # the layers' RMSNorm eps
    qk_eps: float
    sync: Tensor  # int32 [2]: the grid barrier's counter and generation

    @property
    def n_layer(self) -> int:
        return self.wqkv.shape[0]


def fast_stack(x: Tensor, w: FastStackWeights, k_cache: Tensor, v_cache: Tensor, rope: Tensor, pos: int,
               config: FastStackConfig | None = None) -> Tensor:
    """x [M, D] (M <= MAX_ROWS) through all fast layers at position `pos` -> [M, D]. k_cache, v_cache:
    [NL, M, Hk, L, d] (L > pos; positions < pos hold this frame's earlier keys/values, `pos` is written here);
    rope [M, d/2, 2] (cos, sin at pos). CUDA, or CPU under Triton's interpreter."""
    M, D = x.shape
    NL, Hk, d = w.n_layer, w.n_local_heads, w.head_dim
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"fast_stack: 1..{MAX_ROWS} rows, got {M}")
    L = k_cache.shape[3]
    if tuple(k_cache.shape) != (NL, M, Hk, L, d) or v_cache.shape != k_cache.shape or not 0 <= pos < L:
        raise ValueError(f"fast_stack: cache {tuple(k_cache.shape)} does not fit {M} rows, {NL} layers, pos {pos}")
    if v_cache.stride() != k_cache.stride() or k_cache.stride(4) != 1:
        raise ValueError("fast_stack: k and v caches need the same strides, head_dim contiguous")
    cfg = config or FastStackConfig()
    interpreted = small_linear._interpreted()
    grid = 1 if interpreted else (cfg.grid or _sm_count(x.device))
    if not interpreted and grid > _sm_count(x.device):  # the barrier needs every program resident at once
        raise ValueError(f"fast_stack: grid {grid} exceeds the device's {_sm_count(x.device)} SMs")
    F = w.w2.shape[2]
    nq = w.wqkv.shape[1]
    ws = torch.empty((M, nq + w.n_head * d + 2 * D + F), dtype=x.dtype, device=x.device)
    qkv, y, h, g, out = ws.split([nq, w.n_head * d, D, F, D], dim=1)
    x = x.contiguous()
    rope = rope.contiguous()
    dummy = ws
    i8 = w.wqkv_scale is not None
    norm = w.q_norm is not None
    G = w.n_head // Hk
    _kernel()[(grid,)](
        x, out, qkv, y, h, g, w.wqkv, w.wo, w.w13, w.w2, w.attention_norm, w.ffn_norm,
        w.q_norm if norm else dummy, w.k_norm if norm else dummy,
        w.wqkv_scale if i8 else dummy, w.wo_scale if i8 else dummy, w.w13_scale if i8 else dummy,
        w.w2_scale if i8 else dummy, k_cache, v_cache, rope, w.sync,
        M, NL, pos, float(w.eps), float(w.qk_eps), d ** -0.5, ws.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3), rope.stride(0),
        D=D, NQKV=nq, FF=F, H=w.n_head, HK=Hk, HD=d, G=G, BG=max(2, next_pow2(G)), LP=next_pow2(L),
        IS_INT8=i8, QK_NORM=norm, EMU_BF16=x.dtype == torch.bfloat16 and interpreted, GRID=grid,
        BN_QKV=cfg.bn_qkv, BN_O=cfg.bn_o, BN_13=cfg.bn_13, BN_2=cfg.bn_2,
        KP_D=next_pow2(D), KP_HD=next_pow2(w.n_head * d), KP_F=next_pow2(F),
        num_warps=cfg.num_warps, num_stages=1)
    return out


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---- the kernel: plain functions jitted on first use (importing this module needs no Triton) ------------------
tl = None  # triton.language, bound by _kernel() (see small_linear.py: names resolve in this module's globals)
_rounded = None  # small_linear's rounding helper, bound by _kernel()


@functools.lru_cache(maxsize=1)
def _kernel():
    global tl, _rounded, _grid_sync, _attend_tile, _load_tile, _row_dot, _epilogue, _linear_rows, _swiglu_rows, \
        _linear_phase
    import triton
    import triton.language as tl

    small_linear._kernel()  # jits its rounding helper
    _rounded = small_linear._rounded
    _grid_sync, _attend_tile, _load_tile, _row_dot, _epilogue, _linear_rows, _swiglu_rows, _linear_phase = (
        triton.jit(f) for f in (_grid_sync, _attend_tile, _load_tile, _row_dot, _epilogue, _linear_rows,
                                _swiglu_rows, _linear_phase))
    global _barrier_only_kernel
    _barrier_only_kernel = triton.jit(_barrier_only_kernel)
    return triton.jit(do_not_specialize=["M", "pos"])(_fast_stack_kernel)


def _grid_sync(SYNC, GRID: tl.constexpr):
    # every program of the launch reaches this point before any goes on; their stores before it are visible after
    if GRID > 1:
        tl.debug_barrier()  # this program's threads have all stored
        gen = tl.atomic_add(SYNC + 1, 0, sem="relaxed")  # read before arriving: it cannot move until all arrive
        arrived = tl.atomic_add(SYNC, 1, sem="acq_rel")
        if arrived == GRID - 1:  # the last one resets the count and releases the others
            tl.atomic_xchg(SYNC, 0, sem="relaxed")
            tl.atomic_add(SYNC + 1, 1, sem="release")
        else:  # poll with plain loads past L1 (polling atomics on one word serialize in L2 and slow the release)
            while tl.load(SYNC + 1, volatile=True) == gen:
                pass
            tl.atomic_add(SYNC + 1, 0, sem="acquire")  # what the others stored before arriving is seen from here on
        tl.debug_barrier()


def _attend_tile(QKV, Y, QW, KW, KC, VC, ROT, row, kvh, pos, s_ws, s_kb, s_kh, s_kt, s_rb, qk_eps, scale,
                 H: tl.constexpr, HK: tl.constexpr, HD: tl.constexpr, G: tl.constexpr, BG: tl.constexpr,
                 LP: tl.constexpr, QK_NORM: tl.constexpr, EMU_BF16: tl.constexpr):
    # row `row`, KV head kvh: rotate (and normalise) q's G heads and the new key from the raw qkv, store key and
    # value at `pos`, attend over positions 0..pos -> Y's G heads. Roundings: paged_attention's qkv kernel
    DT = Y.dtype.element_ty
    g = tl.arange(0, BG)
    g_ok = g < G
    dd = tl.arange(0, HD)
    partner = dd ^ 1
    base = QKV + row * s_ws
    q_at = base + (kvh * G + g)[:, None] * HD
    cos = tl.load(ROT + row * s_rb + (dd // 2) * 2).to(tl.float32)
    sin = tl.load(ROT + row * s_rb + (dd // 2) * 2 + 1).to(tl.float32)
    sin = tl.where(dd % 2 == 0, -sin, sin)
    q = tl.load(q_at + dd[None, :], mask=g_ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)  # [BG, HD]
    q2 = tl.load(q_at + partner[None, :], mask=g_ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    k_at = base + (H + kvh) * HD
    kn = tl.load(k_at + dd, cache_modifier=".cg").to(tl.float32)
    k2 = tl.load(k_at + partner, cache_modifier=".cg").to(tl.float32)
    vn = tl.load(base + (H + HK + kvh) * HD + dd, cache_modifier=".cg").to(tl.float32)
    if QK_NORM:  # rms_norm per head: fp32 mean of squares, rounded, times the weight, rounded
        rq = tl.math.rsqrt(tl.sum(q * q, axis=1) / HD + qk_eps)[:, None]
        rk = tl.math.rsqrt(tl.sum(kn * kn, axis=0) / HD + qk_eps)
        qw = tl.load(QW + dd).to(tl.float32)
        qw2 = tl.load(QW + partner).to(tl.float32)
        kw = tl.load(KW + dd).to(tl.float32)
        kw2 = tl.load(KW + partner).to(tl.float32)
        q = _rounded(_rounded(q * rq, DT, EMU_BF16) * qw[None, :], DT, EMU_BF16)
        q2 = _rounded(_rounded(q2 * rq, DT, EMU_BF16) * qw2[None, :], DT, EMU_BF16)
        kn = _rounded(_rounded(kn * rk, DT, EMU_BF16) * kw, DT, EMU_BF16)
        k2 = _rounded(_rounded(k2 * rk, DT, EMU_BF16) * kw2, DT, EMU_BF16)
    q = _rounded(q * cos[None, :] + q2 * sin[None, :], DT, EMU_BF16)  # apply_rope, rounded to q's dtype
    kn = _rounded(kn * cos + k2 * sin, DT, EMU_BF16)
    slot = row * s_kb + kvh * s_kh
    tl.store(KC + slot + pos * s_kt + dd, kn.to(KC.dtype.element_ty))
    tl.store(VC + slot + pos * s_kt + dd, vn.to(VC.dtype.element_ty))
    # earlier positions of this frame (written by earlier launches) and this one from registers
    t = tl.arange(0, LP)
    old = t < pos
    kt = tl.load(KC + slot + t[:, None] * s_kt + dd[None, :], mask=old[:, None], other=0.0).to(tl.float32)  # [LP, HD]
    vt = tl.load(VC + slot + t[:, None] * s_kt + dd[None, :], mask=old[:, None], other=0.0).to(tl.float32)
    s = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale  # [BG, LP]
    s = tl.where(old[None, :], s, float("-inf"))
    s_new = tl.sum(q * kn[None, :], axis=1) * scale  # [BG]
    m = tl.maximum(tl.max(s, axis=1), s_new)
    p = tl.exp(s - m[:, None])
    pn = tl.exp(s_new - m)
    den = tl.sum(p, axis=1) + pn
    acc = tl.sum(p[:, :, None] * vt[None, :, :], axis=1) + pn[:, None] * vn[None, :]  # [BG, HD]
    out = acc / den[:, None]
    tl.store(Y + row * s_ws + (kvh * G + g)[:, None] * HD + dd[None, :], out.to(DT), mask=g_ok[:, None])


def _load_tile(W, col0, n_hi, K, s_wn, BN: tl.constexpr, KP: tl.constexpr):
    # weight rows [col0, min(col0 + BN, n_hi)) x K -> [BN, KP] (masked lanes 0; issued ahead of the barrier it waits)
    cols = col0 + tl.arange(0, BN)
    kk = tl.arange(0, KP)
    return tl.load(W + cols[:, None] * s_wn + kk[None, :], mask=(cols < n_hi)[:, None] & (kk < K)[None, :], other=0)


def _row_dot(w, X, r, M, K, NW, eps, HAS_NORM: tl.constexpr, DT: tl.constexpr, EMU_BF16: tl.constexpr,
             KP: tl.constexpr):
    # row r of X [M, K] (rms-normalised as small_linear rounds it) times the tile: fp32 sums [BN]
    kk = tl.arange(0, KP)
    k_ok = (kk < K) & (tl.full([KP], r, tl.int32) < M)  # (a tensor: the interpreter's masks reject a scalar)
    x = tl.load(X + kk, mask=k_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    if HAS_NORM:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        x = _rounded(_rounded(x * rstd, DT, EMU_BF16) * tl.load(NW + kk, mask=kk < K, other=0.0).to(tl.float32),
                     DT, EMU_BF16)
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


def _epilogue(y, S, R, Y, r, M, col0, n_hi, IS_INT8: tl.constexpr, HAS_RES: tl.constexpr, DT: tl.constexpr,
              EMU_BF16: tl.constexpr, BN: tl.constexpr):
    # rounded as F.linear, * scale (int8), + residual; stored to Y's row r
    cols = col0 + tl.arange(0, BN)
    ok = (cols < n_hi) & (tl.full([BN], r, tl.int32) < M)
    y = _rounded(y, DT, EMU_BF16)
    if IS_INT8:
        y = _rounded(y * _rounded(tl.load(S + cols, mask=ok, other=0.0), DT, EMU_BF16), DT, EMU_BF16)
    if HAS_RES:
        y = _rounded(tl.load(R + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32) + y, DT, EMU_BF16)
    tl.store(Y + cols, y.to(DT), mask=ok)


def _linear_rows(w, X, S, NW, R, Y, M, K, s_ws, col0, n_hi, eps, HAS_NORM: tl.constexpr, IS_INT8: tl.constexpr,
                 HAS_RES: tl.constexpr, DT: tl.constexpr, EMU_BF16: tl.constexpr, BN: tl.constexpr,
                 KP: tl.constexpr):
    # out = [rms_norm](x) @ tile.T [+ residual] for rows 0..M-1 (M <= 2: the same code per row)
    for r in tl.static_range(2):
        y = _row_dot(w, X + r * s_ws, r, M, K, NW, eps, HAS_NORM, DT, EMU_BF16, KP)
        _epilogue(y, S, R + r * s_ws, Y + r * s_ws, r, M, col0, n_hi, IS_INT8, HAS_RES, DT, EMU_BF16, BN)


def _linear_phase(W, X, S, NW, R, Y, M, N, K, s_ws, eps, pid, GRID: tl.constexpr, HAS_NORM: tl.constexpr,
                  IS_INT8: tl.constexpr, HAS_RES: tl.constexpr, DT: tl.constexpr, EMU_BF16: tl.constexpr,
                  BN: tl.constexpr, KP: tl.constexpr):
    # Y = [rms_norm](X) @ W.T [+ R] (W [N, K]): this program's tiles of BN columns, round-robin over the grid
    for t in range(pid, tl.cdiv(N, BN), GRID):
        c0 = t * BN
        hi = tl.minimum(c0 + BN, N)
        w = _load_tile(W, c0, hi, K, K, BN, KP)
        _linear_rows(w, X, S, NW, R, Y, M, K, s_ws, c0, hi, eps, HAS_NORM, IS_INT8, HAS_RES, DT, EMU_BF16, BN, KP)


def _swiglu_rows(w1, w3, X, S, NW, Y, M, K, FF, s_ws, col0, n_hi, eps, IS_INT8: tl.constexpr, DT: tl.constexpr,
                 EMU_BF16: tl.constexpr, BN: tl.constexpr, KP: tl.constexpr):
    # silu(n @ W1.T) * (n @ W3.T), n = rms_norm(x), rounded at each step as the eager ops (small_linear's order)
    cols = col0 + tl.arange(0, BN)
    for r in tl.static_range(2):
        ok = (cols < n_hi) & (tl.full([BN], r, tl.int32) < M)
        a = _rounded(_row_dot(w1, X + r * s_ws, r, M, K, NW, eps, True, DT, EMU_BF16, KP), DT, EMU_BF16)
        b = _rounded(_row_dot(w3, X + r * s_ws, r, M, K, NW, eps, True, DT, EMU_BF16, KP), DT, EMU_BF16)
        if IS_INT8:
            a = _rounded(a * _rounded(tl.load(S + cols, mask=ok, other=0.0), DT, EMU_BF16), DT, EMU_BF16)
            b = _rounded(b * _rounded(tl.load(S + FF + cols, mask=ok, other=0.0), DT, EMU_BF16), DT, EMU_BF16)
        a = _rounded(a / (1.0 + tl.exp(-a)), DT, EMU_BF16)
        tl.store(Y + r * s_ws + cols, _rounded(a * b, DT, EMU_BF16).to(DT), mask=ok)


def _fast_stack_kernel(X, OUT, QKV, Y, HB, GB, WQKV, WO, W13, W2, ANW, FNW, QW, KW, SQKV, SO, S13, S2, KC, VC, ROT,
                       SYNC, M, NL, pos, eps, qk_eps, scale, s_ws, s_kl, s_kb, s_kh, s_kt, s_rb,
                       D: tl.constexpr, NQKV: tl.constexpr, FF: tl.constexpr, H: tl.constexpr, HK: tl.constexpr,
                       HD: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, LP: tl.constexpr,
                       IS_INT8: tl.constexpr, QK_NORM: tl.constexpr, EMU_BF16: tl.constexpr, GRID: tl.constexpr,
                       BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_13: tl.constexpr, BN_2: tl.constexpr,
                       KP_D: tl.constexpr, KP_HD: tl.constexpr, KP_F: tl.constexpr):
    # X [M, D] in; OUT [M, D] the running x (and the result); QKV, Y, HB, GB: one workspace, row stride s_ws.
    # Each phase's tiles go round-robin over the programs; a tile loads its weights before the activations
    DT = OUT.dtype.element_ty
    pid = tl.program_id(0)
    HDH: tl.constexpr = H * HD
    if pid == 0:  # OUT = X: the layers read and rewrite OUT
        dcol = tl.arange(0, KP_D)
        for r in range(0, M):
            tl.store(OUT + r * s_ws + dcol, tl.load(X + r * D + dcol, mask=dcol < D), mask=dcol < D)
    _grid_sync(SYNC, GRID)
    for layer in range(0, NL):
        # qkv = rms_norm(x) @ Wqkv
        _linear_phase(WQKV + layer * NQKV * D, OUT, SQKV + layer * NQKV, ANW + layer * D, OUT, QKV, M, NQKV, D,
                      s_ws, eps, pid, GRID, True, IS_INT8, False, DT, EMU_BF16, BN_QKV, KP_D)
        _grid_sync(SYNC, GRID)
        for t in range(pid, M * HK, GRID):
            _attend_tile(QKV, Y, QW + layer * HD, KW + layer * HD, KC + layer * s_kl, VC + layer * s_kl, ROT,
                         t // HK, t % HK, pos, s_ws, s_kb, s_kh, s_kt, s_rb, qk_eps, scale, H, HK, HD, G, BG, LP,
                         QK_NORM, EMU_BF16)
        _grid_sync(SYNC, GRID)
        # h = x + y @ Wo
        _linear_phase(WO + layer * D * HDH, Y, SO + layer * D, ANW, OUT, HB, M, D, HDH, s_ws, eps, pid, GRID,
                      False, IS_INT8, True, DT, EMU_BF16, BN_O, KP_HD)
        _grid_sync(SYNC, GRID)
        # g = silu(n @ W1) * (n @ W3), n = rms_norm(h)
        w13 = W13 + layer * 2 * FF * D
        for t in range(pid, tl.cdiv(FF, BN_13), GRID):
            c0 = t * BN_13
            hi = tl.minimum(c0 + BN_13, FF)
            w1 = _load_tile(w13, c0, hi, D, D, BN_13, KP_D)
            w3 = _load_tile(w13 + FF * D, c0, hi, D, D, BN_13, KP_D)
            _swiglu_rows(w1, w3, HB, S13 + layer * 2 * FF, FNW + layer * D, GB, M, D, FF, s_ws, c0, hi, eps,
                         IS_INT8, DT, EMU_BF16, BN_13, KP_D)
        _grid_sync(SYNC, GRID)
        # x = h + g @ W2
        _linear_phase(W2 + layer * D * FF, GB, S2 + layer * D, ANW, HB, OUT, M, D, FF, s_ws, eps, pid, GRID,
                      False, IS_INT8, True, DT, EMU_BF16, BN_2, KP_F)
        _grid_sync(SYNC, GRID)


def _barrier_only_kernel(SYNC, N, GRID: tl.constexpr):
    # N grid barriers and nothing else: their cost (scripts/device/fast_stack_bench.py)
    for _ in range(0, N):
        _grid_sync(SYNC, GRID)
