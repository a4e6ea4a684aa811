"""Snake activation as one Triton kernel: x + sin(alpha x)^2 / alpha, per channel alpha.

Eager PyTorch runs Snake as five elementwise passes over the codec's largest tensors (the decoder's
audio-rate activations); torch.compile fuses them but costs a long dynamo trace of the whole codec on
every process start (docs/performance.md, "Codec"). This kernel gives the fused pass without
tracing: the codec then runs eagerly inside a CUDA graph. Math in fp32, stored in x's dtype.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

BLOCK = 1024
MAX_GRID_Y = 65535  # CUDA's limit on a launch's second grid axis


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(X, A, Y, C, L, Y_ROW, BLOCK: tl.constexpr):
        # one program per (row of B*C, block of L); x rows are contiguous, y rows Y_ROW apart (a wider
        # buffer's tail: the streaming codec writes Snake's output right behind a conv's kept history)
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < L
        a = tl.load(A + row % C).to(tl.float32)
        x = tl.load(X + row.to(tl.int64) * L + offs, mask=keep, other=0.0).to(tl.float32)
        s = tl.sin(a * x)
        y = x + s * s / (a + 1e-9)
        tl.store(Y + row.to(tl.int64) * Y_ROW + offs, y.to(Y.dtype.element_ty), mask=keep)

    @triton.jit
    def kernel_time_major(X, A, B, Y, N, C, Y_B, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        # x [B, L, C] contiguous, N = L * C elements a row b; y rows Y_B apart (a wider buffer's tail); HAS_BIAS:
        # x + bias[c] (the preceding conv's bias, rounded to x's dtype as the eager add rounds) goes in
        b = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < N
        c = offs % C
        a = tl.load(A + c, mask=keep, other=1.0).to(tl.float32)
        x = tl.load(X + b.to(tl.int64) * N + offs, mask=keep, other=0.0)
        if HAS_BIAS:
            x = x + tl.load(B + c, mask=keep, other=0.0).to(x.dtype)
        x = x.to(tl.float32)
        s = tl.sin(a * x)
        y = x + s * s / (a + 1e-9)
        tl.store(Y + b.to(tl.int64) * Y_B + offs, y.to(Y.dtype.element_ty), mask=keep)

    @triton.jit
    def kernel_residual_bias(X, Y, B, OUT, N, C, BLOCK: tl.constexpr):
        # out = x + (y + bias[c]) over [B * L, C] contiguous, each add rounded to x's dtype as the eager adds round
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < N
        y = tl.load(Y + offs, mask=keep, other=0.0) + tl.load(B + offs % C, mask=keep, other=0.0)
        out = tl.load(X + offs, mask=keep, other=0.0) + y.to(OUT.dtype.element_ty)
        tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=keep)

    return kernel, kernel_time_major, kernel_residual_bias


def snake_triton_time_major(x: Tensor, alpha: Tensor, out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """snake_triton for time-major activations: x [B, L, C] (CUDA); alpha: [1, C, 1] -> [B, L, C], written into
    `out` when given (a view [B, L, C] contiguous within each b, e.g. buf[:, k:]); bias [C]: snake(x + bias)."""
    B, L, C = x.shape
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    if out is not None and (out.shape != x.shape or out.stride(2) != 1 or out.stride(1) != C
                            or out.dtype != x.dtype):
        raise ValueError(f"snake_triton_time_major: out {tuple(out.shape)} strides {out.stride()} does not fit x "
                         f"{tuple(x.shape)}")
    blocks = -(-(L * C) // BLOCK)
    if blocks > MAX_GRID_Y:  # a chunk of ~340+ frames at the decoder's last stage: the eager ops
        from ...codec.conv import snake_time_major

        return snake_time_major(x, alpha, out, bias)
    if x.numel():
        _kernel()[1][(B, blocks)](x, alpha.reshape(C).contiguous(), y if bias is None else bias, y, L * C, C,
                                  y.stride(0), HAS_BIAS=bias is not None, BLOCK=BLOCK)
    return y


def residual_bias_triton(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    """x + (y + bias) in one pass: x, y [B, L, C] (CUDA, one dtype), bias [C]."""
    if x.shape != y.shape or x.dtype != y.dtype or bias.shape != (x.shape[-1],):
        raise ValueError(f"residual_bias_triton: x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}, "
                         f"bias {tuple(bias.shape)} do not fit")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        _kernel()[2][(-(-x.numel() // BLOCK),)](x, y, bias.contiguous(), out, x.numel(), x.shape[-1], BLOCK=BLOCK)
    return out


def snake_triton(x: Tensor, alpha: Tensor, out: Tensor | None = None) -> Tensor:
    """x: [B, C, L] (CUDA); alpha: [1, C, 1] -> [B, C, L] like x, written into `out` when given (a view
    [B, C, L] whose last dim is contiguous and whose rows are evenly spaced, e.g. buf[..., k:])."""
    B, C, L = x.shape
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    if out is not None and (out.shape != x.shape or out.stride(2) != 1 or out.stride(0) != C * out.stride(1)
                            or out.dtype != x.dtype):
        raise ValueError(f"snake_triton: out {tuple(out.shape)} strides {out.stride()} does not fit x {tuple(x.shape)}")
    if x.numel():
        _kernel()[0][(B * C, -(-L // BLOCK))](x, alpha.reshape(C).contiguous(), y, C, L, y.stride(1), BLOCK=BLOCK)
    return y
