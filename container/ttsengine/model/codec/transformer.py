"""The codec's window-limited causal transformer (S1 spec §7.1): MHA with interleaved bf16 RoPE,
SwiGLU, LayerScale, query i sees keys i-window+1 .. i.

Attention runs block by block (queries in blocks of `window`), so memory grows with T * window,
not T^2. Upstream's RoPE table stops at `block_size`; here it is computed for any length (RoPE only
encodes relative offsets inside the window), so inputs longer than block_size still work.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..layers import Attention, FeedForward, RMSNorm, attend, cached_rope_table
from .config import CodecTransformerConfig


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int) -> Tensor:
    # -> bool [1, 1, Tq, Tk]: key j visible to query i iff i - window < j <= i
    d = q_pos[:, None] - k_pos[None, :]
    return ((d >= 0) & (d < window))[None, None]


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """q, k, v: [B, H, T, d] (same positions) -> [B, H, T, d], causal within `window`."""
    T = q.shape[2]
    pos = torch.arange(T, device=q.device)
    if T <= 2 * window:
        return attend(q, k, v, window_mask(pos, pos, window))
    out = []
    for start in range(0, T, window):
        stop = min(start + window, T)
        k0 = max(0, start - window + 1)
        mask = window_mask(pos[start:stop], pos[k0:stop], window)
        out.append(attend(q[:, :, start:stop], k[:, :, k0:stop], v[:, :, k0:stop], mask))
    return torch.cat(out, dim=2)


class CodecBlock(nn.Module):
    def __init__(self, cfg: CodecTransformerConfig):
        super().__init__()
        self.attention = Attention(cfg.dim, cfg.n_head, cfg.n_head, cfg.head_dim)
        self.feed_forward = FeedForward(cfg.dim, cfg.intermediate_size)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention_layer_scale = LayerScale(cfg.dim)
        self.ffn_layer_scale = LayerScale(cfg.dim)
        self.window = cfg.window

    def forward(self, x: Tensor, rope: Tensor) -> Tensor:
        # x: [B, T, C], rope: [1, T, d/2, 2]
        B, T, _ = x.shape
        att = self.attention
        q, k, v = att.project(self.attention_norm(x), rope)
        y = windowed_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.window)
        y = att.wo(y.transpose(1, 2).reshape(B, T, att.n_head * att.head_dim))
        h = x + self.attention_layer_scale(y)
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class CodecTransformer(nn.Module):
    def __init__(self, cfg: CodecTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(CodecBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def rope(self, start: int, stop: int, device) -> Tensor:
        # -> [1, stop - start, d/2, 2] for absolute positions start..stop-1
        length = max(self.cfg.block_size, 1 << (stop - 1).bit_length())
        table = cached_rope_table(length, self.cfg.head_dim, self.cfg.rope_base, str(device))
        return table[None, start:stop]

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, C, T] (channels first) -> [B, C, T]
        h = x.transpose(1, 2)
        rope = self.rope(0, h.shape[1], h.device)
        for layer in self.layers:
            h = layer(h, rope)
        return self.norm(h).transpose(1, 2)
