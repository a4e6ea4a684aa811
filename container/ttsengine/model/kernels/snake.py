"""Snake activation as one Triton kernel: x + sin(alpha x)^2 / alpha, per channel alpha.

Eager PyTorch runs Snake as five elementwise passes over the codec's largest tensors (the decoder's
audio-rate activations); torch.compile fuses them but costs a long dynamo trace of the whole codec on
every process start (about 20 s of a warm start on an H100). This kernel gives the fused pass without
tracing: the codec then runs eagerly inside a CUDA graph. Math in fp32, stored in x's dtype.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

BLOCK = 1024


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

    return kernel


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
        _kernel()[(B * C, -(-L // BLOCK))](x, alpha.reshape(C).contiguous(), y, C, L, y.stride(1), BLOCK=BLOCK)
    return y
