"""One frame from the slow model's output: sample the slow token, then run the fast transformer
codebook by codebook (S1 spec §6.2). Batched, no host sync; the same function serves the eager
reference and the graphed GPU step.

The per-codebook work goes through `FrameOps`, so the engine can swap in compiled versions of the
same three functions (every fast position has the same shapes: attention always spans all n slots,
masked, so one compiled graph serves them all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .dual_ar import DualAR
from .layers import KVCache, causal_mask_from_positions
from .sampling import RepetitionWindow, SamplingTensors, draw, exponential_noise, logits_to_probs

# Upstream samples residual codebooks from the first 1024 fast logits only (the codec's codebooks
# have 1024 entries); with a smaller codebook the cut is a no-op.
FAST_LOGITS_LIMIT = 1024


def sample_token(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor, previous_ids: Tensor | None,
                 seed_lo: Tensor, seed_hi: Tensor, counter: Tensor) -> Tensor:
    """logits: [B, V] -> token ids int64 [B] (penalty, top-p, temperature, then a keyed Exp(1) draw)."""
    probs = logits_to_probs(logits, temperature, top_p, penalty, previous_ids)
    return draw(probs, exponential_noise(seed_lo, seed_hi, counter, probs.shape[-1]))


def fast_layer_step(layer: nn.Module, x: Tensor, rope: Tensor, cache_k: Tensor, cache_v: Tensor, pos: Tensor,
                    mask: Tensor) -> Tensor:
    """One fast block at one position: x [B, 1, Df]; cache_k/v [B, Hk, n, d] (written at pos [B, 1])."""
    return layer(x, rope, mask, KVCache(cache_k, cache_v), pos, cache_k.shape[2])


def fast_logits(model: DualAR, x: Tensor, limit: int) -> Tensor:
    # x: [B, 1, Df] -> [B, limit]
    return model.fast_output(model.fast_norm(x))[:, 0, :limit]


@dataclass(frozen=True)
class FrameOps:
    sample: Callable = sample_token
    fast_layer: Callable = fast_layer_step
    fast_head: Callable = fast_logits


def sample_frame(model: DualAR, slow_logits: Tensor, slow_hidden: Tensor, params: SamplingTensors,
                 frame_index: Tensor, window: RepetitionWindow | None, fresh: Tensor | None = None,
                 ops: FrameOps = FrameOps()) -> Tensor:
    """slow_logits: [B, V], slow_hidden: [B, D] (pre-norm), frame_index: int64 [B] (the row's frame
    counter, keys its random stream) -> frame [B, n+1] int64 = [token0, code_0 .. code_{n-1}].

    `window` None: no repetition penalty at all (upstream's first frame). `fresh`: bool [B] rows whose
    first frame this is inside a batch; they sample without penalty (penalty 1.0 is an exact no-op)."""
    n, cb = model.cfg.num_codebooks, model.cfg.codebook_size
    B, device = slow_logits.shape[0], slow_logits.device
    counter = frame_index * n
    penalty = params.repetition_penalty
    if fresh is not None:
        penalty = torch.where(fresh, torch.ones_like(penalty), penalty)
    token0 = ops.sample(slow_logits, params.temperature, params.top_p, penalty,
                        window.slow_ids() if window is not None else None, params.seed_lo, params.seed_hi, counter)

    f = model.cfg.fast
    caches = [KVCache.empty(B, f.n_local_heads, n, f.head_dim, slow_hidden.dtype, device) for _ in model.fast_layers]
    # Fast position 0 reads the slow hidden; its logits are unused (codebook 0 is the slow token).
    x = model.fast_input(slow_hidden)[:, None]
    # No upper clamp upstream; ids past the semantic range would index out of fast_embeddings.
    code = (token0 - model.semantic_begin_id).clamp(0, cb - 1)
    frame = [token0, code]
    limit = min(FAST_LOGITS_LIMIT, cb)
    for k in range(n):
        pos = torch.full((B, 1), k, dtype=torch.int64, device=device)
        rope, mask = model.rope_fast[pos], causal_mask_from_positions(pos, n)
        for layer, c in zip(model.fast_layers, caches):
            x = ops.fast_layer(layer, x, rope, c.k, c.v, pos, mask)
        if k == 0:
            x = model.fast_embeddings(code)[:, None]
            continue
        code = ops.sample(ops.fast_head(model, x, limit), params.temperature, params.top_p, penalty,
                          window.codebook_ids(k) if window is not None else None, params.seed_lo, params.seed_hi,
                          counter + k)
        frame.append(code)
        if k + 1 < n:
            x = model.fast_embeddings(code)[:, None]
    return torch.stack(frame, dim=1)
