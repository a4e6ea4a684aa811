"""A dense stride-1 convolution over time-major activations as one Triton implicit GEMM (feature codec_own_convs).

The codec's convolutions as cuDNN runs them need a plan per input shape, built (and, for speed, timed) the first time
each shape runs: seconds per CUDA graph of the codec, on every process start (docs/performance.md, "Codec"). Over
time-major activations ([b, n, C], channels contiguous) a conv with kernel k and dilation d is a GEMM whose K axis
walks the k taps: out[b, t, :] = sum_j x[b, t + j d, :] @ W[j], with each tap's [positions, channels] tile a plain
strided load. No plan, no tuning: Triton compiles the kernel once per tile shape and keeps it in its cache (the
kernel cache directory). Products in fp32 (fp32 inputs without TF32), one rounding at the store.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..triton_support import next_pow2


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    # M and N_OUT change with every call's rows and chunk: not specialised (Triton would compile again for each one's
    # divisibility by 16). X_B stays specialised: its divisibility tells Triton the rows are 16-byte aligned, which
    # turns the input tile's loads into vector async copies (scalar 2-byte loads without it, in the sm_90 build)
    @triton.jit(do_not_specialize=["M", "N_OUT"])
    def kernel(X, W, B, Y, M, N_OUT, CI, CO, X_B, X_T, DIL, KSIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
               IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        # Y [M = batch x N_OUT, CO] contiguous; X [batch, N_OUT + (KSIZE - 1) DIL, CI] with strides (X_B, X_T, 1);
        # W [KSIZE, CI, CO] contiguous. One program per (BM output positions, BN output channels).
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok, col_ok = rows < M, cols < CO
        b, t = rows // N_OUT, rows % N_OUT
        base = b.to(tl.int64) * X_B + t.to(tl.int64) * X_T  # [BM] each output position's first tap
        ks = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for j in range(KSIZE):
            for c0 in range(0, CI, BK):
                c = c0 + ks
                c_ok = c < CI
                a = tl.load(X + base[:, None] + (j * DIL * X_T + c)[None, :], mask=row_ok[:, None] & c_ok[None, :],
                            other=0.0)
                w = tl.load(W + (j * CI + c)[:, None] * CO + cols[None, :], mask=c_ok[:, None] & col_ok[None, :],
                            other=0.0)
                if IEEE:
                    acc += tl.dot(a, w, input_precision="ieee")
                else:
                    acc += tl.dot(a, w)
        if HAS_BIAS:
            acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows.to(tl.int64)[:, None] * CO + cols[None, :], acc.to(Y.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])

    return kernel


def tiles(m: int, ci: int, co: int) -> tuple[int, int, int, int]:
    """(BM, BN, BK, warps) for M output positions, CI -> CO channels: a heuristic (no autotuning, whose timing would
    come back at start); BN covers narrow outputs (the last conv's one channel) with the least padding tl.dot allows."""
    bm = 128 if m >= 8192 else 64
    bn = min(128, max(16, next_pow2(co)))
    bk = 64 if ci % 64 == 0 else 32 if ci >= 32 else 16
    return bm, bn, bk, 8 if bm * bn >= 128 * 128 else 4


def conv_time_major(x: Tensor, weight: Tensor, dilation: int, bias: Tensor | None = None) -> Tensor:
    """x [b, n, Ci] (CUDA; channels contiguous, any position and batch strides, e.g. a wider buffer's view);
    weight [k, Ci, Co] contiguous (a conv's [Co, Ci, k] permuted once); bias [Co] or None -> [b, n - (k-1) d, Co]."""
    batch, n, ci = x.shape
    k, wci, co = weight.shape
    n_out = n - (k - 1) * dilation
    if wci != ci or n_out < 0 or (x.stride(2) != 1 and ci > 1) or not weight.is_contiguous() or weight.dtype != x.dtype:
        raise ValueError(f"conv_time_major: x {tuple(x.shape)} strides {x.stride()} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} (contiguous {weight.is_contiguous()}), dilation "
                         f"{dilation} do not fit")
    y = torch.empty(batch, n_out, co, dtype=x.dtype, device=x.device)
    m = batch * n_out
    if m == 0:
        return y
    bm, bn, bk, warps = tiles(m, ci, co)
    grid = (-(-m // bm), -(-co // bn))
    _kernel()[grid](x, weight, weight if bias is None else bias, y, m, n_out, ci, co, x.stride(0), x.stride(1),
                    dilation, KSIZE=k, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BM=bm, BN=bn, BK=bk,
                    num_warps=warps, num_stages=3)
    return y
