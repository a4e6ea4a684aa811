"""A dense stride-1 convolution over time-major activations as one Triton implicit GEMM (feature codec_own_convs).

The codec's convolutions as cuDNN runs them need a plan per input shape, built (and, for speed, timed) the first time
each shape runs: seconds per CUDA graph of the codec, on every process start (docs/performance.md, "Codec"). Over
time-major activations ([b, n, C], channels contiguous) a conv with kernel k and dilation d is a GEMM whose K axis
walks the k taps: out[b, t, :] = sum_j x[b, t + j d, :] @ W[j], with each tap's [positions, channels] tile a plain
strided load. No plan, no tuning: Triton compiles the kernel once per tile shape and keeps it in its cache (the
kernel cache directory). Products in fp32 (fp32 inputs without TF32), one rounding at the store.

Epilogues (feature codec_fused_convs): what reads a residual unit's conv outputs can run in the conv's store instead
of as a pass of its own over the activations: "snake" stores snake(y + bias) (the dilated conv, then the unit's second
Snake), "residual" stores r + (y + bias) (the 1-tap conv, then the residual sum). Both round as the separate ops do:
the conv's output to the activations' dtype, the bias added in that dtype, Snake in fp32 (model/kernels/codec/snake.py).
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

    # M and N_OUT change with every call's rows and chunk, DIL with every residual unit: not specialised (Triton would
    # compile again for each one's divisibility by 16 or equality to 1). X_B stays specialised: its divisibility
    # tells Triton the rows are 16-byte aligned, which turns the input tile's loads into vector async copies (scalar
    # 2-byte loads without it, in the sm_90 build)
    @triton.jit(do_not_specialize=["M", "N_OUT", "DIL", "N_IN"])
    def kernel(X, W, B, Y, E, M, N_OUT, CI, CO, X_B, X_T, DIL, PAD, N_IN, KSIZE: tl.constexpr,
               HAS_BIAS: tl.constexpr, PADDED: tl.constexpr, EPILOGUE: tl.constexpr, IEEE: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
        # Y [M = batch x N_OUT, CO] contiguous; X [batch, N_IN, CI] with strides (X_B, X_T, 1), N_IN = N_OUT +
        # (KSIZE - 1) DIL - 2 PAD: PADDED, PAD zeros on each side (a transposed conv as a conv), else PAD 0 and
        # every tap in range; W [KSIZE, CI, CO] contiguous. EPILOGUE 0: y + bias in fp32; 1: snake(y + bias), E the
        # alphas [CO]; 2: E[m, c] + (y + bias), E [M, CO] contiguous. One program per (BM positions, BN channels).
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok, col_ok = rows < M, cols < CO
        b, t = rows // N_OUT, rows % N_OUT
        base = b.to(tl.int64) * X_B + t.to(tl.int64) * X_T  # [BM] each output position's first tap
        ks = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        # one loop over K = the taps x the channels rounded up to BK (each step inside one tap): a single loop is
        # what Triton software-pipelines (STAGES loads in flight); two nested ones pipelined only the inner,
        # a few steps long at the codec's 96-384 channels
        ci_pad = tl.cdiv(CI, BK) * BK
        for kk in tl.range(0, KSIZE * ci_pad, BK, num_stages=STAGES):
            j = kk // ci_pad
            c = kk - j * ci_pad + ks
            c_ok = c < CI
            a_ok = row_ok[:, None] & c_ok[None, :]
            if PADDED:  # input position t + j DIL - PAD, zero outside [0, N_IN)
                p = t + j * DIL - PAD
                a_ok &= ((p >= 0) & (p < N_IN))[:, None]
            a = tl.load(X + base[:, None] + ((j * DIL - PAD) * X_T + c)[None, :], mask=a_ok, other=0.0)
            w = tl.load(W + (j * CI + c)[:, None] * CO + cols[None, :], mask=c_ok[:, None] & col_ok[None, :],
                        other=0.0)
            if IEEE:
                acc += tl.dot(a, w, input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        at = rows.to(tl.int64)[:, None] * CO + cols[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
        if EPILOGUE == 0 and HAS_BIAS:  # the bias into the fp32 sum: one rounding
            acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        y = acc.to(Y.dtype.element_ty)  # with an epilogue: the conv's output as a separate conv would store it
        if EPILOGUE != 0 and HAS_BIAS:
            y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(Y.dtype.element_ty)[None, :]
        if EPILOGUE == 1:
            alpha = tl.load(E + cols, mask=col_ok, other=1.0).to(tl.float32)[None, :]
            x = y.to(tl.float32)
            s = tl.sin(alpha * x)
            y = x + s * s / (alpha + 1e-9)
        elif EPILOGUE == 2:
            y = tl.load(E + at, mask=ok, other=0.0) + y
        tl.store(Y + at, y.to(Y.dtype.element_ty), mask=ok)

    return kernel


def tiles(m: int, ci: int, co: int) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages) for M output positions, CI -> CO channels: a heuristic (no autotuning, whose timing
    would come back at start); BN covers narrow outputs (the last conv's one channel) with the least padding tl.dot
    allows."""
    # from the sweep over the real codec's convs at 256 rows x 8 frames (docs/speed.md, "The codec's own convs"):
    # BN a divisor of CO where one fits (192 -> 3 x 64, not 2 x 128 with a quarter padded), 4 warps below 256 input
    # channels, 8 above; the differences among the rest were within the sweep's noise
    bm = 128 if m >= 8192 else 64
    bn = 128 if co % 128 == 0 else 64 if co % 64 == 0 else min(128, max(16, next_pow2(co)))
    bk = 64 if ci % 64 == 0 else 32 if ci >= 32 else 16
    return bm, bn, bk, 8 if bm * bn >= 128 * 128 and ci >= 256 else 4, 3


def conv_time_major(x: Tensor, weight: Tensor, dilation: int, bias: Tensor | None = None, pad: int = 0,
                    tile: tuple[int, int, int, int, int] | None = None, snake_alpha: Tensor | None = None,
                    residual: Tensor | None = None) -> Tensor:
    """x [b, n, Ci] (CUDA; channels contiguous, any position and batch strides, e.g. a wider buffer's view);
    weight [k, Ci, Co] contiguous (a conv's [Co, Ci, k] permuted once); bias [Co] or None -> [b, n - (k-1) d + 2 pad,
    Co], x read as if pad zero positions stood on each side (none are written). tile: (BM, BN, BK, warps, stages)
    instead of tiles()'s (scripts/device/own_conv_tiles.py sweeps them). snake_alpha [Co] (or [1, Co, 1]): snake(conv +
    bias) instead; residual [b, n_out, Co]: residual + (conv + bias) instead (the module docstring's epilogues)."""
    batch, n, ci = x.shape
    k, wci, co = weight.shape
    n_out = n - (k - 1) * dilation + 2 * pad
    if (pad < 0 or wci != ci or n_out < 0 or (x.stride(2) != 1 and ci > 1) or not weight.is_contiguous()
            or weight.dtype != x.dtype):
        raise ValueError(f"conv_time_major: x {tuple(x.shape)} strides {x.stride()} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} (contiguous {weight.is_contiguous()}), dilation "
                         f"{dilation}, pad {pad} do not fit")
    y = torch.empty(batch, n_out, co, dtype=x.dtype, device=x.device)
    m = batch * n_out
    epilogue, extra = 0, weight
    if snake_alpha is not None:
        epilogue, extra = 1, snake_alpha.reshape(co).contiguous()
    elif residual is not None:
        if residual.shape != y.shape or residual.dtype != y.dtype:
            raise ValueError(f"conv_time_major: residual {tuple(residual.shape)} {residual.dtype} does not fit the "
                             f"output {tuple(y.shape)} {y.dtype}")
        epilogue, extra = 2, residual.contiguous()
    if m == 0:
        return y
    bm, bn, bk, warps, stages = tile or tiles(m, ci, co)
    grid = (-(-m // bm), -(-co // bn))
    _kernel()[grid](x, weight, weight if bias is None else bias, y, extra, m, n_out, ci, co, x.stride(0), x.stride(1),
                    dilation, pad, n, KSIZE=k, HAS_BIAS=bias is not None, PADDED=pad > 0, EPILOGUE=epilogue,
                    IEEE=x.dtype == torch.float32, BM=bm, BN=bn, BK=bk, STAGES=stages, num_warps=warps)
    return y
