"""One decode-step linear and its neighbours in one Triton kernel, for up to 64 rows.

    out = epilogue(rms_norm(x) @ W.T)   prologue optional; epilogue: none, + residual, or SwiGLU of merged W1|W3

At 1-16 rows a linear is a memory-bound GEMV (at 17-64 still far from compute-bound) whose launch and round trips
cost as much as its bytes; the norm before it and the add or SwiGLU after it are more tiny kernels. Here each
program owns BLOCK_N output columns (for SwiGLU: column j of both halves, so the [M, 2H] product is never written),
streams their weight rows in BLOCK_K chunks and keeps every step's rounding where the eager ops round
(`small_linear_reference`).

Determinism: no atomics, no split-K. Every program computes a 16-row tile up to 16 rows and a 64-row one above
(rows past M load as zeros and are never stored: loading them as copies of row 0, unmasked, made 24 rows
slower than 64; docs/performance.md, "Layer GEMV rows") and the default config depends on M only through its
class (up to CORE_ROWS, up to 16, or more), so within a class the kernel binary, and thus each row's reduction
order, is the same alone or in a batch.
The 64-row tile's RMSNorm runs as a kernel of its own before the linear (`_normed`, same roundings): computed in
every program, as the 16-row tile does, its reads of all of x cost more than the weights
(scripts/device/wide_tile_probe.py; docs/performance.md, "Layer GEMV rows").
(Across classes, as across the engine's larger buckets that run cuBLAS, a row may differ in its last bits.) Two
ways to multiply:
- `use_dot`: tl.dot on the 16- or 64-row tile, software-pipelined (tensor cores for 16-bit; fp32 FMAs, no TF32,
  for fp32);
- CUDA cores: the rows in a runtime loop, each a [BLOCK_N, BLOCK_K] multiply and sum (costs grow with M, loads
  are not pipelined, BLOCK_N may go below 16: more programs on 1,024-column layers).
The interpreter (CPU tests) truncates fp32 -> bf16 and multiplies bf16 dot operands as integers, so there the
kernel keeps bf16 values in fp32 and rounds them to nearest even by hand (EMU_BF16); the GPU path never does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layers import rms_norm
from .launch import gdc_ops, launch_fitting, launch_options
from .triton_support import next_pow2, triton_available

SMALL_LINEAR_MAX_ROWS = 64
TILE_ROWS = 16  # rows every program computes up to this many rows (the tl.dot minimum): see the module docstring
WIDE_TILE_ROWS = 64  # and above it (one Hopper warp-group MMA's rows)
NORM_ROWS = 2  # rows per program of the 64-row tile's norm kernel (32 programs at 64 rows: latency, not bytes)
NORM_WHOLE_K = 4096  # up to this K it holds its rows whole (one read of x)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class SmallLinearConfig:
    """Tiles of one launch. block_n: output columns per program (>= 16 with use_dot); block_k: K per step."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = True


# Rows up to which the default tiles are the CUDA-core ones (16-bit weights): one or two streams, the latency case
CORE_ROWS = 2
CORE_MAX_K = 4096  # with pdl the CUDA-core tiles hold all of K (a power of two) at once: up to here


def small_linear_config(n_out: int, k: int, dtype: torch.dtype, swiglu: bool = False,
                        rows: int = TILE_ROWS, norm: bool = True, pdl: bool = False) -> SmallLinearConfig:
    """The default tiles for n_out output columns (SwiGLU: H) over k inputs at `rows` rows. Three classes of M, each
    with one config per shape, so a row's bits are the same at any M of its class: above TILE_ROWS the 64-row tile
    (tl.dot, steps of up to 64 rows: TTS_LAYER_GEMV_ROWS; 32 columns, K steps of 128 and 4 stages from 2,048
    columns or with SwiGLU, 16, 256 and 4 on 1,024, the vocabulary head's 64, 128 and 3: the best per class of rows
    at 24 and 64, small_linear_bench.py --rows 24,64); up to CORE_ROWS,
    16-bit and int8 weights take the CUDA-core path with narrow column blocks and long K steps (more programs in
    flight on 1-4k-column layers: measured faster there), otherwise the tl.dot tiles
    (scripts/device/small_linear_bench.py over the S1-mini decode shapes); SwiGLU's two weight tiles keep the dot
    path at every M (32 columns measured faster than 16). Figures: docs/performance.md, "Layer GEMV rows".
    pdl (the kernel loads its first K step of weights before waiting on the previous kernel, kernels/launch.py): at
    up to CORE_ROWS the CUDA-core tiles hold all of K at once, SwiGLU's two tiles included (8 columns, two steps of
    512), so all (or half) of a program's weights load while the previous kernel runs: with PDL they measured
    faster than these default tiles, without PDL slower (scripts/device/pdl_bench.py; docs/performance.md, "Layer
    GEMV rows"): they are only the default where PDL runs."""
    block_k = min(128 if dtype == torch.float32 else 256, max(16, next_pow2(k)))
    if pdl and rows <= CORE_ROWS and dtype != torch.float32 and n_out < 16384 and k <= CORE_MAX_K:
        if swiglu:
            return SmallLinearConfig(block_n=8, block_k=min(512, max(16, next_pow2(k))), num_warps=4, num_stages=2,
                                     use_dot=False)
        block_n = 16 if n_out > 1024 else (8 if norm else 2)
        return SmallLinearConfig(block_n=block_n, block_k=max(16, next_pow2(k)), num_warps=4, num_stages=2,
                                 use_dot=False)
    if rows > TILE_ROWS:  # the 64-row tile (its norm a kernel of its own: _normed)
        if n_out >= 16384:
            return SmallLinearConfig(block_n=64, block_k=min(128, block_k), num_warps=4, num_stages=3)
        if swiglu or n_out >= 2048:
            return SmallLinearConfig(block_n=32, block_k=min(128, block_k), num_warps=4, num_stages=4)
        return SmallLinearConfig(block_n=16, block_k=block_k, num_warps=4, num_stages=4)
    if swiglu:
        return SmallLinearConfig(block_n=32, block_k=block_k, num_warps=4, num_stages=3)
    if rows <= CORE_ROWS and dtype != torch.float32 and n_out < 16384:
        # 1,024 columns: 512 programs of 2 (a norm prologue re-reads x per program: 8); wider layers 16
        block_n = 16 if n_out > 1024 else (8 if norm else 2)
        return SmallLinearConfig(block_n=block_n, block_k=min(1024, max(16, next_pow2(k))), num_warps=4,
                                 num_stages=2, use_dot=False)
    if n_out >= 16384:  # the vocabulary head
        return SmallLinearConfig(block_n=64, block_k=block_k, num_warps=4, num_stages=3)
    if n_out >= 4096:
        return SmallLinearConfig(block_n=32, block_k=min(128, block_k), num_warps=8, num_stages=4)
    return SmallLinearConfig(block_n=16, block_k=block_k, num_warps=4, num_stages=4)


# ---- plain torch: the numerics the kernel follows -----------------------------------------------------
def small_linear_reference(x: Tensor, weight: Tensor, *, scale: Tensor | None = None,
                           norm_weight: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None,
                           swiglu: bool = False, out_rows: int | None = None) -> Tensor:
    """The eager ops the kernel fuses, each rounding to x's dtype as it does: rms_norm (layers.py), F.linear
    (int8: as quant.int8_linear_reference), then residual + y or silu(y1) * y3. x [M, K] -> [M, N'] with
    N' = out_rows or weight rows (SwiGLU: half of them)."""
    _check(x, weight, scale, norm_weight, residual, swiglu, out_rows)
    if out_rows is not None:
        weight = weight[:out_rows]
        scale = None if scale is None else scale[:out_rows]
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    if scale is None:
        y = F.linear(x, weight)
    else:
        y = F.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
    if swiglu:
        a, b = y.chunk(2, dim=-1)
        return F.silu(a) * b
    return y if residual is None else residual + y


def _check(x: Tensor, weight: Tensor, scale: Tensor | None, norm_weight: Tensor | None, residual: Tensor | None,
           swiglu: bool, out_rows: int | None) -> int:
    """Raises ValueError on arguments outside the contract -> the output's column count."""
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"small_linear: x must be [M, K] with M >= 1, got {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"small_linear: x must be bf16, fp16 or fp32, got {x.dtype}")
    M, K = x.shape
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"small_linear: weight must be [N, {K}] for x {tuple(x.shape)}, got {tuple(weight.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("small_linear: weight rows must be contiguous (row-major [N, K])")
    N = weight.shape[0]
    if weight.dtype == torch.int8:
        if scale is None or scale.dtype != torch.float32 or tuple(scale.shape) != (N,):
            raise ValueError(f"small_linear: int8 weights need scale, fp32 [{N}]")
    elif weight.dtype != x.dtype:
        raise ValueError(f"small_linear: weight dtype {weight.dtype} is neither x's ({x.dtype}) nor int8")
    elif scale is not None:
        raise ValueError("small_linear: scale is for int8 weights only")
    if norm_weight is not None and (tuple(norm_weight.shape) != (K,) or norm_weight.dtype != x.dtype):
        raise ValueError(f"small_linear: norm_weight must be [{K}] in x's dtype ({x.dtype})")
    if out_rows is not None:
        if swiglu:
            raise ValueError("small_linear: out_rows does not apply to swiglu (whose halves are W1 | W3)")
        if not 1 <= out_rows <= N:
            raise ValueError(f"small_linear: out_rows must be in 1..{N}, got {out_rows}")
        N = out_rows
    if swiglu:
        if residual is not None:
            raise ValueError("small_linear: one epilogue: residual or swiglu, not both")
        if N % 2:
            raise ValueError(f"small_linear: swiglu needs an even number of weight rows (W1 | W3), got {N}")
        N //= 2
    if residual is not None and (tuple(residual.shape) != (M, N) or residual.dtype != x.dtype):
        raise ValueError(f"small_linear: residual must be [{M}, {N}] in x's dtype, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    tensors = [t for t in (weight, scale, norm_weight, residual) if t is not None]
    if any(t.device != x.device for t in tensors):
        raise ValueError("small_linear: all tensors must be on x's device")
    return N


# ---- the fused op -------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _interpreted() -> bool:
    """Whether Triton built the kernel for its interpreter (TRITON_INTERPRET=1, which Triton reads): then it
    runs on CPU tensors too."""
    return type(_kernel()).__name__ == "InterpretedFunction"


def small_linear(x: Tensor, weight: Tensor, *, scale: Tensor | None = None, norm_weight: Tensor | None = None,
                 eps: float = 0.0, residual: Tensor | None = None, swiglu: bool = False, out_rows: int | None = None,
                 config: SmallLinearConfig | None = None, pdl: bool = False) -> Tensor:
    """small_linear_reference's result from one Triton kernel (x [M, K], M <= SMALL_LINEAR_MAX_ROWS), where
    Triton runs (CUDA, or anywhere under its interpreter: TRITON_INTERPRET=1); elsewhere the reference. `config`: tiles
    (None: small_linear_config; a row's bits are those of its config, so keep one config for every M). `pdl`: load
    the first weight chunk before reading x and, where the GPU has it (launch.pdl_runs), launch as a programmatic
    dependent of the previous kernel; the default tiles are then pdl's (small_linear_config), and a row's bits those
    of its tiles: launched as a dependent or not, the same sums in the same order."""
    n_out = _check(x, weight, scale, norm_weight, residual, swiglu, out_rows)
    if x.shape[0] > SMALL_LINEAR_MAX_ROWS:
        raise ValueError(f"small_linear: at most {SMALL_LINEAR_MAX_ROWS} rows, got {x.shape[0]}")
    if config is not None:
        _check_config(config)
    if not (triton_available() and (x.is_cuda or _interpreted())):
        return small_linear_reference(x, weight, scale=scale, norm_weight=norm_weight, eps=eps, residual=residual,
                                      swiglu=swiglu, out_rows=out_rows)
    return _launch(x, weight, scale, norm_weight, eps, residual, swiglu, n_out, config, pdl)


def _check_config(cfg: SmallLinearConfig) -> None:
    for name in ("block_n", "block_k", "num_warps"):
        v = getattr(cfg, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"small_linear: config.{name} must be a power of two, got {v}")
    if cfg.block_k < 16 or (cfg.use_dot and cfg.block_n < 16):
        raise ValueError(f"small_linear: block_k and (with use_dot) block_n must be >= 16, got {cfg}")


def _launch(x: Tensor, weight: Tensor, scale: Tensor | None, norm_weight: Tensor | None, eps: float,
            residual: Tensor | None, swiglu: bool, n_out: int, config: SmallLinearConfig | None, pdl: bool) -> Tensor:
    M, K = x.shape
    cfg = config or small_linear_config(n_out, K, x.dtype, swiglu, M, norm_weight is not None, pdl)
    bk = min(cfg.block_k, max(16, next_pow2(K)))
    x = x if x.stride(1) == 1 else x.contiguous()
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    if norm_weight is not None and M > TILE_ROWS:  # the 64-row tile: the norm as a kernel of its own
        x = _normed(x, norm_weight, eps, pdl)
        norm_weight = None
    y = torch.empty((M, n_out), dtype=x.dtype, device=x.device)
    dummy = y  # pointer arguments a variant does not read
    bm = TILE_ROWS if M <= TILE_ROWS else WIDE_TILE_ROWS
    args = (x, weight, dummy if scale is None else scale, dummy if norm_weight is None else norm_weight,
            dummy if residual is None else residual, y, M, n_out, K, n_out if swiglu else 0,
            x.stride(0), weight.stride(0), 0 if residual is None else residual.stride(0), y.stride(0), float(eps))
    flags = dict(HAS_NORM=norm_weight is not None, IS_INT8=scale is not None, HAS_RES=residual is not None,
                 SWIGLU=swiglu, USE_DOT=cfg.use_dot, TF32=x.dtype != torch.float32,
                 EMU_BF16=x.dtype == torch.bfloat16 and _interpreted(), BM=bm, BN=cfg.block_n, BK=bk,
                 EVEN_K=K % bk == 0, PREFETCH=pdl, num_warps=cfg.num_warps, **launch_options(pdl, x.device))
    grid = (-(-n_out // cfg.block_n),)
    key = (str(x.device), x.dtype, weight.dtype, tuple(sorted(flags.items())))
    launch_fitting(lambda stages: _kernel()[grid](*args, num_stages=stages, **flags), key, cfg.num_stages)
    return y


def _normed(x: Tensor, norm_weight: Tensor, eps: float, pdl: bool) -> Tensor:
    """x [M, K] -> rms_norm(x) * norm_weight [M, K] as the kernel's prologue rounds it (_norm_rows_kernel)."""
    M, K = x.shape
    bk = max(16, next_pow2(K)) if K <= NORM_WHOLE_K else 256
    xn = torch.empty((M, K), dtype=x.dtype, device=x.device)
    _norm_kernel()[(-(-M // NORM_ROWS),)](
        x, norm_weight, xn, M, K, x.stride(0), float(eps), BM=NORM_ROWS, BK=bk, EVEN_K=K % bk == 0,
        EMU_BF16=x.dtype == torch.bfloat16 and _interpreted(), num_warps=4, **launch_options(pdl, x.device))
    return xn


# ---- the kernel: plain functions jitted on first use (importing this module needs no Triton) --------------------
tl = None  # triton.language, bound by _kernel(): a kernel's names resolve in its module's globals (the interpreter
#            re-executes the source there and sees no closure), so the helpers and `tl` live here, not in a closure
_gdc_wait = _gdc_launch_dependents = None  # Triton's grid dependency control (launch.gdc_ops), bound by _kernel()


@functools.lru_cache(maxsize=1)
def _kernel():
    global tl, _rounded, _x_tile, _norm_store, _weights, _mac, _gdc_wait, _gdc_launch_dependents
    import triton
    import triton.language as tl

    _gdc_wait, _gdc_launch_dependents = gdc_ops()

    _rounded = triton.jit(_rounded)
    _x_tile = triton.jit(_x_tile)
    _norm_store = triton.jit(_norm_store)
    _weights = triton.jit(_weights)
    _mac = triton.jit(_mac)
    return triton.jit(do_not_specialize=["M"])(_small_linear_kernel)


@functools.lru_cache(maxsize=1)
def _norm_kernel():
    import triton

    _kernel()  # binds tl and the helpers
    return triton.jit(do_not_specialize=["M"])(_norm_rows_kernel)


def _rounded(v, DT: tl.constexpr, EMU_BF16: tl.constexpr):
    # fp32 v -> v rounded to DT (kept in fp32): what an eager op in DT does to its result
    if EMU_BF16:  # round to nearest even on the bits (the interpreter's fp32 -> bf16 truncates)
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        r = u.to(tl.float32, bitcast=True)
    else:
        r = v.to(DT).to(tl.float32)
    return r


def _small_linear_kernel(X, W, S, NW, R, Y, M, N, K, H, s_xm, s_wn, s_rm, s_ym, eps,
                         HAS_NORM: tl.constexpr, IS_INT8: tl.constexpr, HAS_RES: tl.constexpr,
                         SWIGLU: tl.constexpr, USE_DOT: tl.constexpr, TF32: tl.constexpr, EMU_BF16: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                         PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False):
    # X [M, K], W [N (+ H), K] (SwiGLU: column j of the output reads W rows j and H + j), Y [M, N]
    DT = Y.dtype.element_ty
    rm = tl.arange(0, BM)
    m_ok = rm < M
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = cols < N
    rn = tl.where(n_ok, cols, 0).to(tl.int64)  # columns past N read row 0 (never stored): unmasked loads
    rk = tl.arange(0, BK)
    wp = W + rn[:, None] * s_wn + rk[None, :]  # [BN, BK]
    xp = X + rm.to(tl.int64)[:, None] * s_xm + rk[None, :]  # [BM, BK]; rows past M are masked: zeros
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc3 = tl.zeros([BM, BN], dtype=tl.float32)  # SwiGLU's W3 half

    k_first = 0
    if PREFETCH:
        # the first K chunk of this program's weights, which no kernel writes, is loaded before anything the
        # previous kernel produces is read: with PDL (programmatic dependent launch, sm_90+) this runs while the
        # previous kernel still computes, so the step's chain of small GEMVs overlaps launch and memory latency
        w0, w30 = _weights(wp, H * s_wn, 0, K, rk, SWIGLU, EVEN_K)
        k_first = BK
        if PDL:
            _gdc_wait()  # the previous kernel has finished and its writes are visible
            # the next kernel may start its own weight loads now (after the wait, so at most one kernel runs ahead)
            _gdc_launch_dependents()

    # prologue: each row's 1 / rms over all of K, once per program (x is small and stays in L2)
    rstd = tl.zeros([BM], dtype=tl.float32)
    if HAS_NORM:
        ss = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            xk = _x_tile(xp, k0, K, rk, m_ok, EVEN_K).to(tl.float32)
            ss += tl.sum(xk * xk, axis=1)
        rstd = tl.math.rsqrt(ss / K + eps)

    if PREFETCH:
        acc, acc3 = _mac(acc, acc3, w0, w30, X, xp, NW, rstd, rm, rk, 0, M, K, s_xm, HAS_NORM, SWIGLU, USE_DOT,
                         TF32, EMU_BF16, EVEN_K, DT)
    for k0 in range(k_first, K, BK):
        w, w3 = _weights(wp, H * s_wn, k0, K, rk, SWIGLU, EVEN_K)
        acc, acc3 = _mac(acc, acc3, w, w3, X, xp, NW, rstd, rm, rk, k0, M, K, s_xm, HAS_NORM, SWIGLU, USE_DOT,
                         TF32, EMU_BF16, EVEN_K, DT)

    # epilogue, rounding after each step as the eager ops do
    y = _rounded(acc, DT, EMU_BF16)  # F.linear's output
    if IS_INT8:  # * scale.to(x.dtype)
        y = _rounded(y * _rounded(tl.load(S + rn).to(tl.float32), DT, EMU_BF16)[None, :], DT, EMU_BF16)
    if SWIGLU:
        y3 = _rounded(acc3, DT, EMU_BF16)
        if IS_INT8:
            y3 = _rounded(y3 * _rounded(tl.load(S + H + rn).to(tl.float32), DT, EMU_BF16)[None, :], DT, EMU_BF16)
        y = _rounded(y / (1.0 + tl.exp(-y)), DT, EMU_BF16)  # F.silu in fp32 (torch's formula), rounded
        y = _rounded(y * y3, DT, EMU_BF16)
    out_mask = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        res = tl.load(R + rm[:, None] * s_rm + cols[None, :], mask=out_mask, other=0.0).to(tl.float32)
        y = _rounded(res + y, DT, EMU_BF16)
    tl.store(Y + rm[:, None] * s_ym + cols[None, :], y.to(DT), mask=out_mask)


def _x_tile(xp, k0, K, rk, m_ok, EVEN_K: tl.constexpr):
    # the [BM, BK] tile of x at k0: rows past M (m_ok False) and columns past K read as zeros, never stored
    if EVEN_K:
        return tl.load(xp + k0, mask=m_ok[:, None], other=0.0)
    return tl.load(xp + k0, mask=m_ok[:, None] & (k0 + rk < K)[None, :], other=0.0)


def _norm_rows_kernel(X, NW, XN, M, K, s_xm, eps, BM: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                      EMU_BF16: tl.constexpr, PDL: tl.constexpr = False):
    # XN [M, K] = rms_norm(X) * NW with the prologue's and _mac's roundings, BM rows a program: the 64-row tile's
    # norm, once for all programs of the linear after it (each computing every row's 1 / rms itself cost more than
    # the linear's weights at 64 rows)
    DT = XN.dtype.element_ty
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    m_ok = rm < M
    rk = tl.arange(0, BK)
    xp = X + rm.to(tl.int64)[:, None] * s_xm + rk[None, :]
    if PDL:
        _gdc_wait()  # x is the previous kernel's output
        _gdc_launch_dependents()  # the linear may load its weights meanwhile
    if BK >= K:  # the rows whole in registers: one read
        xk = _x_tile(xp, 0, K, rk, m_ok, EVEN_K).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xk * xk, axis=1) / K + eps)
        _norm_store(XN, NW, xk, rstd, rm, m_ok, rk, 0, K, DT, EMU_BF16)
    else:
        ss = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            xk = _x_tile(xp, k0, K, rk, m_ok, EVEN_K).to(tl.float32)
            ss += tl.sum(xk * xk, axis=1)
        rstd = tl.math.rsqrt(ss / K + eps)
        for k0 in range(0, K, BK):
            xk = _x_tile(xp, k0, K, rk, m_ok, EVEN_K).to(tl.float32)
            _norm_store(XN, NW, xk, rstd, rm, m_ok, rk, k0, K, DT, EMU_BF16)


def _norm_store(XN, NW, xk, rstd, rm, m_ok, rk, k0, K, DT: tl.constexpr, EMU_BF16: tl.constexpr):
    # XN's [BM, BK] tile at k0 = x * rstd, rounded, * the norm weight, rounded (the eager rms_norm's two roundings)
    k_ok = k0 + rk < K
    nw = tl.load(NW + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
    xn = _rounded(_rounded(xk * rstd[:, None], DT, EMU_BF16) * nw[None, :], DT, EMU_BF16)
    tl.store(XN + rm.to(tl.int64)[:, None] * K + k0 + rk[None, :], xn.to(DT), mask=m_ok[:, None] & k_ok[None, :])


def _weights(wp, w3_offset, k0, K, rk, SWIGLU: tl.constexpr, EVEN_K: tl.constexpr):
    # the [BN, BK] weight tile at k0 and (SwiGLU) its W3 twin w3_offset further; without SwiGLU the twin is w
    if EVEN_K:
        w = tl.load(wp + k0)
    else:
        w = tl.load(wp + k0, mask=(k0 + rk < K)[None, :], other=0)
    w3 = w
    if SWIGLU:
        if EVEN_K:
            w3 = tl.load(wp + w3_offset + k0)
        else:
            w3 = tl.load(wp + w3_offset + k0, mask=(k0 + rk < K)[None, :], other=0)
    return w, w3


def _mac(acc, acc3, w, w3, X, xp, NW, rstd, rm, rk, k0, M, K, s_xm, HAS_NORM: tl.constexpr, SWIGLU: tl.constexpr,
         USE_DOT: tl.constexpr, TF32: tl.constexpr, EMU_BF16: tl.constexpr, EVEN_K: tl.constexpr,
         DT: tl.constexpr):
    # acc (acc3) += the rows of X at k0 (rms-normalised with the norm weight) times the tile w (w3) -> (acc, acc3)
    k_ok = k0 + rk < K
    if HAS_NORM:
        nw = tl.load(NW + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
    if USE_DOT:
        xt = _x_tile(xp, k0, K, rk, rm < M, EVEN_K)
        if HAS_NORM:  # upstream's order: normalise in fp32, round, scale in x's dtype, round
            xf = _rounded(xt.to(tl.float32) * rstd[:, None], DT, EMU_BF16)
            xt = _rounded(xf * nw[None, :], DT, EMU_BF16)
        if EMU_BF16:  # bf16 values, multiplied in fp32: exact products, as on tensor cores
            a = xt.to(tl.float32)
            acc = tl.dot(a, tl.trans(w.to(tl.float32)), acc, allow_tf32=False)
            if SWIGLU:
                acc3 = tl.dot(a, tl.trans(w3.to(tl.float32)), acc3, allow_tf32=False)
        else:
            a = xt.to(DT)
            acc = tl.dot(a, tl.trans(w.to(DT)), acc, allow_tf32=TF32)
            if SWIGLU:
                acc3 = tl.dot(a, tl.trans(w3.to(DT)), acc3, allow_tf32=TF32)
    else:
        wf = w.to(tl.float32)
        w3f = w3.to(tl.float32)
        for m in range(0, M):  # the same code for every row: its result cannot depend on M
            xr = tl.load(X + m * s_xm + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
            if HAS_NORM:
                r = tl.sum(tl.where(rm == m, rstd, 0.0), axis=0)  # rstd[m], exactly
                xr = _rounded(_rounded(xr * r, DT, EMU_BF16) * nw, DT, EMU_BF16)
            row = (rm == m)[:, None]
            acc = tl.where(row, acc + tl.sum(wf * xr[None, :], axis=1)[None, :], acc)
            if SWIGLU:
                acc3 = tl.where(row, acc3 + tl.sum(w3f * xr[None, :], axis=1)[None, :], acc3)
    return acc, acc3
