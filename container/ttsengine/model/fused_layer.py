"""A decoder layer at a few rows as five fused kernels (TTS_FEATURES layer_gemv).

At 1-64 rows (TTS_LAYER_GEMV_ROWS) every linear is a memory-bound GEMV, and the norms, RoPE, residual
adds and SwiGLU around them are as many kernels again, each a few microseconds of launch and round trip. Here a layer is

    qkv = rms_norm(x) @ Wqkv                        small_linear, norm prologue
    y   = attention(q/k-norm + RoPE of qkv, cache)  the paged kernel from the raw qkv (writes k, v)
    h   = x + y @ Wo                                small_linear, residual epilogue
    g   = silu(n @ W1) * (n @ W3), n = rms_norm(h)  small_linear, norm prologue, SwiGLU epilogue (merged W1|W3)
    out = h + g @ W2                                small_linear, residual epilogue

with each step rounding where the eager ops round (model/kernels/small_linear.py, paged_attention.py), bf16 or
int8 weights (model/quant.py Int8Linear). The slow and the fast layers share it (the fast cache is a pool of one
page per row: engine/device/compile/units.py fast_attention).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from .kernels.paged_attention import attention_splits, write_and_attend_qkv
from .kernels.small_linear import SMALL_LINEAR_MAX_ROWS, small_linear
from .quant import Int8Linear

MAX_ROWS = SMALL_LINEAR_MAX_ROWS
MAX_SPLITS = 8  # split_attention: at most this many programs per row and KV head (one row: 8 heads x 8 = 64)


def linear_weight(linear: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """The (weight [N, K], int8 scale [N] or None) small_linear reads for `linear`; None when it cannot (a bias,
    a quantized tensor subclass, int4)."""
    if type(linear) is nn.Linear and linear.bias is None and type(linear.weight.data) is Tensor:
        return linear.weight, None
    if isinstance(linear, Int8Linear) and linear.bias is None:
        return linear.weight_int8, linear.scale
    return None


def merged_ffn_weight(ff: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """W1|W3 as one [2H, K] weight (FeedForward.merge_inputs made it) and its int8 scale; None when not merged."""
    w13 = getattr(ff, "w13", None)
    if w13 is not None:
        return w13, None
    w13 = getattr(ff, "w13_int8", None)
    return (w13, ff.w13_scale) if w13 is not None else None


def layer_supported(layer: nn.Module) -> bool:
    """Whether every weight of the block has a form the fused kernels read (merge_inputs must have run)."""
    att, ff = layer.attention, layer.feed_forward
    return (all(linear_weight(m) is not None for m in (att.wqkv, att.wo, ff.w2))
            and merged_ffn_weight(ff) is not None)


def make_layer(use_triton: bool, pdl: bool = False, max_splits: int = 1) -> Callable:
    """-> fn with the slow layer unit's signature (engine/device/compile/units.make_slow_layer) running the five
    kernels.
    pdl: each loads its first weights before waiting on the previous kernel, launched as a programmatic dependent
    where the GPU has it (kernels/launch.py: TTS_FEATURES pdl). max_splits > 1: the attention shares each row and
    KV head's pages among up to that many programs where the rows are few (paged_attention.attention_splits:
    TTS_FEATURES split_attention); a pool of one page per row (the fast layers') is never split."""
    # the functions themselves, not their custom ops: nothing traces these layers (they run eager or in CUDA graphs),
    # and an op's first call would import torch._dynamo on a start's path (compat.compiling)
    lin, attend = _plain_linear, write_and_attend_qkv

    def layer_step(layer: nn.Module, x: Tensor, rope: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor,
                   pos: Tensor) -> Tensor:
        # x: [B, 1, D] (B <= MAX_ROWS); rope: [B, 1, d/2, 2]; pos: int64 [B] -> [B, 1, D]
        att, ff, an, fn = layer.attention, layer.feed_forward, layer.attention_norm, layer.ffn_norm
        x2 = x[:, 0]
        w, s = linear_weight(att.wqkv)
        qkv = lin(x2, w, s, an.weight, an.eps, None, False, None, pdl)  # [B, (H + 2 Hk) d]
        qn, kn = att.q_norm, att.k_norm
        splits = attention_splits(x2.shape[0], k_pool.shape[1], table.shape[1], max_splits)  # static per shape
        y = attend(qkv, rope[:, 0], None if qn is None else qn.weight, None if kn is None else kn.weight,
                   0.0 if qn is None else qn.eps, k_pool, v_pool, table, pos, att.n_head, use_triton, pdl,
                   splits)  # [B, H, d]
        w, s = linear_weight(att.wo)
        h = lin(y.reshape(x2.shape[0], -1), w, s, None, 0.0, x2, False, None, pdl)
        w, s = merged_ffn_weight(ff)
        g = lin(h, w, s, fn.weight, fn.eps, None, True, None, pdl)  # [B, hidden]
        w, s = linear_weight(ff.w2)
        return lin(g, w, s, None, 0.0, h, False, None, pdl)[:, None]

    return layer_step


def make_fast_head(pdl: bool = False) -> Callable:
    """-> fn(model, x [B, 1, Df], limit) -> logits [B, limit]: fast_norm and the first `limit` rows of the fast
    head in one kernel (frame.fast_logits' math); pdl as make_layer's."""
    lin = _plain_linear  # as make_layer's

    def fast_head(model: nn.Module, x: Tensor, limit: int) -> Tensor:
        w, s = linear_weight(model.fast_output)
        norm = model.fast_norm
        return lin(x[:, 0], w, s, norm.weight, norm.eps, None, False, min(limit, w.shape[0]), pdl)

    return fast_head


def _plain_linear(x, weight, scale, norm_weight, eps, residual, swiglu, out_rows, pdl):
    # positional, in the order the attention's and the layers' calls above give them
    return small_linear(x, weight, scale=scale, norm_weight=norm_weight, eps=eps, residual=residual, swiglu=swiglu,
                        out_rows=out_rows, pdl=pdl)
