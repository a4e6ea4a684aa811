"""Transformer pieces shared by the DualAR and the codec: RMSNorm, interleaved RoPE, attention, SwiGLU.

Numerics follow the S1 spec (§3.3): RMSNorm math in fp32 then cast back, RoPE table rounded to bf16
and applied in fp32, q/k-norm per head before RoPE, GQA by consecutive repetition.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # x: [..., D]; normalise in fp32, cast back to x's dtype, then scale (upstream's order)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    return y * weight


class RMSNorm(nn.Module):
    # not torch.nn.RMSNorm: absent in torch 2.2, and its cast order differs
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_table(length: int, head_dim: int, base: float, device: torch.device | str = "cpu") -> Tensor:
    """Returns [length, head_dim/2, 2] (cos, sin) rounded to bf16, as upstream stores it."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(length, device=device), inv)
    rot = torch.polar(torch.ones_like(angles), angles)
    return torch.stack([rot.real, rot.imag], dim=-1).to(torch.bfloat16)


@functools.lru_cache(maxsize=32)
def cached_rope_table(length: int, head_dim: int, base: float, device: str) -> Tensor:
    return rope_table(length, head_dim, base, device)


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    # x: [B, T, H, d]; rope: [B or 1, T, d/2, 2] -> [B, T, H, d], rotated pairs (2j, 2j+1) in fp32
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    r = rope[:, :, None]
    a, b = xs[..., 0], xs[..., 1]
    cos, sin = r[..., 0], r[..., 1]
    out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return out.flatten(3).type_as(x)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    """q: [B, H, Tq, d], k/v: [B, Hk, S, d], mask: bool [B|1, 1, Tq, S] (True = may attend) -> [B, H, Tq, d]."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # query head h reads KV head h // groups
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@dataclass
class KVCache:
    """One layer's keys and values: k, v [B, Hk, L, d]. Stale slots past a row's length are masked, not cleared."""

    k: Tensor
    v: Tensor

    @staticmethod
    def empty(batch: int, n_local_heads: int, length: int, head_dim: int, dtype, device) -> KVCache:
        shape = (batch, n_local_heads, length, head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def write(self, pos: Tensor, k: Tensor, v: Tensor) -> None:
        # pos: [B, T] slot per new token; k, v: [B, T, Hk, d]
        rows = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)
        self.k[rows, :, pos] = k.to(self.k.dtype)
        self.v[rows, :, pos] = v.to(self.v.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_local_heads: int, head_dim: int, *, qkv_bias: bool = False,
                 o_bias: bool = False, qk_norm: bool = False, norm_eps: float = 1e-6):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = n_head, n_local_heads, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_local_heads) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None

    def project(self, x: Tensor, rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [B, T, D] -> q [B, T, H, d], k/v [B, T, Hk, d]; split order q | k | v, head-major
        B, T, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_local_heads, self.head_dim)
        v = v.view(B, T, self.n_local_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: KVCache | None = None,
                pos: Tensor | None = None, kv_len: int | None = None) -> Tensor:
        """Without cache: attention among the T inputs. With cache: write them at `pos` [B, T], then
        attend over cache slots [0, kv_len). mask: bool [B|1, 1, T, T or kv_len]."""
        B, T, _ = x.shape
        q, k, v = self.project(x, rope)
        if cache is not None:
            cache.write(pos, k, v)
            k, v = cache.k[:, :, :kv_len], cache.v[:, :, :kv_len]
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        y = attend(q.transpose(1, 2), k.to(q.dtype), v.to(q.dtype), mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def merge_inputs(self) -> bool:
        """Keeps W1 and W3 as the two halves of one weight, buffer `w13` [2 * hidden, dim], with w1/w3's weights
        now views of it (no extra memory), so a decode step can run both as one matmul (swiglu). Plain linears
        with plain weights and no bias only (ours and torchao's quantized ones keep theirs) -> whether merged."""
        w1, w3 = self.w1, self.w3
        if getattr(self, "w13", None) is not None:
            return True
        if type(w1) is not nn.Linear or type(w3) is not nn.Linear or w1.bias is not None or w3.bias is not None:
            return False
        if type(w1.weight.data) is not torch.Tensor or type(w3.weight.data) is not torch.Tensor:
            return False  # torchao keeps nn.Linear and swaps the weight for a quantized tensor subclass: no cat
        w13 = torch.cat([w1.weight.detach(), w3.weight.detach()])
        self.register_buffer("w13", w13, persistent=False)
        h = w1.weight.shape[0]
        w1.weight.data, w3.weight.data = w13[:h], w13[h:]
        return True

    def merge_int8_inputs(self) -> bool:
        """merge_inputs for int8 layers (model/quant.py Int8Linear): buffers `w13_int8` [2 * hidden, dim] and
        `w13_scale` [2 * hidden], w1's and w3's int8 weights and scales their views (no extra memory), for the fused
        small-batch layer (model/fused_layer.py); the layers' own forward is unchanged -> whether merged."""
        w1, w3 = self.w1, self.w3
        if getattr(self, "w13_int8", None) is not None:
            return True
        if not all(hasattr(m, "weight_int8") and getattr(m, "bias", None) is None for m in (w1, w3)):
            return False
        w13, scale = torch.cat([w1.weight_int8, w3.weight_int8]), torch.cat([w1.scale, w3.scale])
        self.register_buffer("w13_int8", w13, persistent=False)
        self.register_buffer("w13_scale", scale, persistent=False)
        h = w1.weight_int8.shape[0]
        w1.weight_int8, w3.weight_int8, w1.scale, w3.scale = w13[:h], w13[h:], scale[:h], scale[h:]
        return True


def swiglu(ff: FeedForward, x: Tensor) -> Tensor:
    """ff(x), through its merged W1|W3 (FeedForward.merge_inputs) when it has one: one matmul, same numbers
    where the matmul computes each output as the two separate ones do."""
    w13 = getattr(ff, "w13", None)
    if w13 is None:
        return ff(x)
    a, b = F.linear(x, w13).chunk(2, dim=-1)
    return ff.w2(F.silu(a) * b)


def causal_mask_from_positions(pos: Tensor, kv_len: int) -> Tensor:
    # pos: [B, T] -> bool [B, 1, T, kv_len]; slot s visible to a query at position p iff s <= p
    slots = torch.arange(kv_len, device=pos.device)
    return (slots[None, None, None, :] <= pos[:, None, :, None])


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + Attn(norm(x)); out = h + FFN(norm(h))."""

    def __init__(self, dim: int, n_head: int, n_local_heads: int, head_dim: int, intermediate_size: int, *,
                 qkv_bias: bool, o_bias: bool, qk_norm: bool, norm_eps: float):
        super().__init__()
        self.attention = Attention(dim, n_head, n_local_heads, head_dim, qkv_bias=qkv_bias, o_bias=o_bias,
                                   qk_norm=qk_norm, norm_eps=norm_eps)
        self.feed_forward = FeedForward(dim, intermediate_size)
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.ffn_norm = RMSNorm(dim, norm_eps)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: KVCache | None = None,
                pos: Tensor | None = None, kv_len: int | None = None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, pos, kv_len)
        return h + self.feed_forward(self.ffn_norm(h))
