"""The DualAR transformer (S1): a slow transformer over frame columns and a fast (depth) transformer
that fills in the codebooks of one frame. Pure module; generation loops live in model/frame.py and
the engine.

Notation: B batch, T time steps, n = num_codebooks, D slow dim, Df fast dim, V vocab, cb codebook size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .dual_ar_config import DualARConfig, TransformerShape
from .layers import KVCache, RMSNorm, TransformerBlock, rope_table


def _blocks(shape: TransformerShape) -> nn.ModuleList:
    return nn.ModuleList(
        TransformerBlock(shape.dim, shape.n_head, shape.n_local_heads, shape.head_dim, shape.intermediate_size,
                         qkv_bias=shape.qkv_bias, o_bias=shape.o_bias, qk_norm=shape.qk_norm,
                         norm_eps=shape.norm_eps)
        for _ in range(shape.n_layer)
    )


class DualAR(nn.Module):
    def __init__(self, cfg: DualARConfig, semantic_begin_id: int, semantic_end_id: int):
        super().__init__()
        self.cfg = cfg
        self.semantic_begin_id, self.semantic_end_id = semantic_begin_id, semantic_end_id
        s, f = cfg.slow, cfg.fast
        self.embeddings = nn.Embedding(cfg.vocab_size, s.dim)
        self.codebook_embeddings = nn.Embedding(cfg.codebook_size * cfg.num_codebooks, s.dim)
        self.layers = _blocks(s)
        self.norm = RMSNorm(s.dim, s.norm_eps)
        self.output = None if cfg.tie_word_embeddings else nn.Linear(s.dim, cfg.vocab_size, bias=False)
        self.fast_project_in = nn.Linear(s.dim, f.dim) if f.dim != s.dim else None
        self.fast_embeddings = nn.Embedding(cfg.codebook_size, f.dim)
        self.fast_layers = _blocks(f)
        self.fast_norm = RMSNorm(f.dim, f.norm_eps)
        self.fast_output = nn.Linear(f.dim, cfg.codebook_size, bias=False)
        self.register_buffer("rope_slow", torch.empty(0, device="cpu"), persistent=False)
        self.register_buffer("rope_fast", torch.empty(0, device="cpu"), persistent=False)

    def init_buffers(self) -> None:
        """Computes the RoPE tables on the module's device; call after weights are in place."""
        device = self.norm.weight.device
        s, f = self.cfg.slow, self.cfg.fast
        self.rope_slow = rope_table(self.cfg.max_seq_len, s.head_dim, s.rope_base, device)
        self.rope_fast = rope_table(self.cfg.num_codebooks, f.head_dim, f.rope_base, device)

    # ---- slow transformer -------------------------------------------------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        # tokens: [B, n+1, T] (row 0 token ids, rows 1..n codes) -> [B, T, D]
        n, cb = self.cfg.num_codebooks, self.cfg.codebook_size
        offsets = torch.arange(n, device=tokens.device)[None, :, None] * cb
        vq = self.codebook_embeddings(tokens[:, 1:] + offsets).sum(dim=1)  # [B, T, D]
        tok = tokens[:, 0]
        semantic = ((tok >= self.semantic_begin_id) & (tok <= self.semantic_end_id))[..., None]
        x = self.embeddings(tok) + torch.where(semantic, vq, torch.zeros_like(vq))
        if self.cfg.scale_codebook_embeddings:
            x = torch.where(semantic, x / (n + 1) ** 0.5, x)
        return x

    def new_caches(self, batch: int, length: int, dtype, device) -> list[KVCache]:
        s = self.cfg.slow
        return [KVCache.empty(batch, s.n_local_heads, length, s.head_dim, dtype, device) for _ in range(s.n_layer)]

    def slow_forward(self, x: Tensor, pos: Tensor, mask: Tensor | None, caches: list[KVCache] | None = None,
                     kv_len: int | None = None) -> Tensor:
        # x: [B, T, D], pos: [B, T] -> hidden [B, T, D] of the last layer, before the final norm
        rope = self.rope_slow[pos]
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, mask, caches[i] if caches is not None else None, pos, kv_len)
        return x

    def slow_head(self, hidden: Tensor) -> Tensor:
        # hidden: [..., D] -> logits [..., V]
        h = self.norm(hidden)
        return self.output(h) if self.output is not None else h @ self.embeddings.weight.T

    # ---- fast transformer -------------------------------------------------------------------
    def fast_input(self, hidden: Tensor) -> Tensor:
        # slow pre-norm hidden [..., D] -> fast position-0 input [..., Df]
        return self.fast_project_in(hidden) if self.fast_project_in is not None else hidden

    def new_fast_caches(self, batch: int, dtype, device) -> list[KVCache]:
        f = self.cfg.fast
        return [KVCache.empty(batch, f.n_local_heads, self.cfg.num_codebooks, f.head_dim, dtype, device)
                for _ in range(f.n_layer)]

    def fast_forward(self, x: Tensor, pos: Tensor, mask: Tensor | None, caches: list[KVCache] | None = None,
                     kv_len: int | None = None, head: bool = True) -> Tensor | None:
        # x: [B, T, Df], pos: [B, T] in 0..n-1 -> logits [B, T, cb] (None when head=False)
        rope = self.rope_fast[pos]
        for i, layer in enumerate(self.fast_layers):
            x = layer(x, rope, mask, caches[i] if caches is not None else None, pos, kv_len)
        return self.fast_output(self.fast_norm(x)) if head else None
