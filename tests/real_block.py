"""One S1-mini decoder block at the real shapes on the GPU, for the fused-layer tests and the device benchmarks
(scripts/device/pdl_bench.py): slow 16/8/128 heads with q/k-norm, fast 16/8/64 without, 1,024 wide, SwiGLU 3,072."""

from __future__ import annotations

import torch
from torch import nn

from ttsengine.model.layers import TransformerBlock
from ttsengine.model.quant import Int8Linear


def real_block(quant: bool, fast: bool) -> tuple[nn.Module, int]:
    """-> (the block, bf16 on CUDA, W1|W3 merged as the fused layers read them; int8 linears if quant, head_dim)."""
    torch.manual_seed(1 + fast)
    d = 64 if fast else 128
    layer = TransformerBlock(1024, 16, 8, d, 3072, qkv_bias=False, o_bias=False, qk_norm=not fast, norm_eps=1e-6)
    for p in layer.parameters():
        p.data.normal_(0, 0.02)
    for norm in (layer.attention_norm, layer.ffn_norm, layer.attention.q_norm, layer.attention.k_norm):
        if norm is not None:
            norm.weight.data.uniform_(0.5, 1.5)
    layer = layer.to("cuda", torch.bfloat16)
    if quant:
        att, ff = layer.attention, layer.feed_forward
        for owner, name in ((att, "wqkv"), (att, "wo"), (ff, "w1"), (ff, "w2"), (ff, "w3")):
            setattr(owner, name, Int8Linear(getattr(owner, name), kernel="dequant"))
        assert ff.merge_int8_inputs()
    else:
        assert layer.feed_forward.merge_inputs()
    return layer, d
