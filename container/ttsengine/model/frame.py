"""One frame from the slow model's output: sample the slow token, then run the fast transformer
codebook by codebook (S1 spec §6.2). Batched, no host sync; the same function serves the eager
reference and the graphed GPU step.

The per-codebook work goes through `FrameOps`, so the engine can swap in compiled or fused versions of
the same functions (every fast position has the same shapes: attention always spans all cache slots,
masked, so one compiled graph serves them all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dual_ar import DualAR
from .layers import KVCache, causal_mask_from_positions
from .sampling import SCAN_BLOCK, RepetitionWindow, SamplingTensors, draw, exponential_noise, logits_to_probs

# Upstream samples residual codebooks from the first 1024 fast logits only (the codec's codebooks
# have 1024 entries); with a smaller codebook the cut is a no-op.
FAST_LOGITS_LIMIT = 1024


def sample_token(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor, previous_ids: Tensor | None,
                 seed_lo: Tensor, seed_hi: Tensor, counter: Tensor, scan_block: int = 0) -> Tensor:
    """logits: [B, V] -> token ids int64 [B] (penalty, top-p, temperature, then a keyed Exp(1) draw)."""
    probs = logits_to_probs(logits, temperature, top_p, penalty, previous_ids, scan_block)
    return draw(probs, exponential_noise(seed_lo, seed_hi, counter, probs.shape[-1]))


def sample_token_blocked(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                         previous_ids: Tensor | None, seed_lo: Tensor, seed_hi: Tensor, counter: Tensor) -> Tensor:
    """sample_token with top-p's cumulative sum in blocks (sampling.blocked_cumsum): the wide vocabulary's scan
    in parallel on the GPU. Same tokens but where the two sums round differently at the cut."""
    return sample_token(logits, temperature, top_p, penalty, previous_ids, seed_lo, seed_hi, counter, SCAN_BLOCK)


def fast_layer_step(layer: nn.Module, x: Tensor, rope: Tensor, cache_k: Tensor, cache_v: Tensor, pos: Tensor,
                    mask: Tensor) -> Tensor:
    """One fast block at one position: x [B, 1, Df]; cache_k/v [B, Hk, n, d] (written at pos [B, 1])."""
    return layer(x, rope, mask, KVCache(cache_k, cache_v), pos, cache_k.shape[2])


def fast_logits(model: DualAR, x: Tensor, limit: int) -> Tensor:
    # x: [B, 1, Df] -> [B, limit]
    return linear_rows(model.fast_output, model.fast_norm(x), limit)[:, 0]


def linear_rows(linear: nn.Module, x: Tensor, rows: int) -> Tensor:
    """linear(x)[..., :rows], reading only the weight's first `rows` rows where it is a plain Linear (the fast
    head: 1,024 of 4,096 codes are sampled, so 3/4 of its weight bytes per codebook were read for nothing). Each
    output is the same dot product; other layers (quantized) compute every row and cut."""
    if type(linear) is nn.Linear and rows < linear.out_features and type(linear.weight.data) is torch.Tensor:
        return F.linear(x, linear.weight[:rows], None if linear.bias is None else linear.bias[:rows])
    return linear(x)[..., :rows]


@dataclass(frozen=True)
class FrameOps:
    sample: Callable = sample_token  # the slow token (and the codebooks unless sample_codebook is set)
    fast_layer: Callable = fast_layer_step
    fast_head: Callable = fast_logits
    sample_codebook: Callable | None = None  # a codebook's token (None: `sample`)
    # a codebook's token and the next fast position's input in one call (kernels/codebook_sampler.py
    # sample_codebook_embed's signature); None: sample_codebook, then the embedding
    sample_embed: Callable | None = None
    # True: fast_layer has the slow layer's signature (engine/device/compile/units.make_slow_layer) and reads its cache
    # [B, Hk, L, d] as a paged pool of B pages of L = _fast_cache_len positions, row b's page b (no mask);
    # False: fast_layer_step over a masked [B, Hk, n, d] cache
    paged_fast: bool = False
    # every fast layer at one position in one call (model/fast_stack.py make_fast_stack); None: fast_layer per layer
    fast_stack: Callable | None = None


def _fast_cache_len(n: int, paged: bool) -> int:
    # the paged kernel's page: a power of two, >= 16 (its tl.dot tiles)
    return max(16, 1 << (n - 1).bit_length()) if paged else n


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
    L = _fast_cache_len(n, ops.paged_fast)
    stack = ops.fast_stack
    if stack is None:
        caches = [KVCache.empty(B, f.n_local_heads, L, f.head_dim, slow_hidden.dtype, device)
                  for _ in model.fast_layers]
    else:  # [2, NL, B, Hk, n, d]: a position only reads the ones this frame wrote before it
        stack_kv = torch.empty((2, len(model.fast_layers), B, f.n_local_heads, n, f.head_dim), dtype=slow_hidden.dtype,
                               device=device)
    # every position's inputs at once (two small kernels a frame, not three per position): row k of
    # positions [n, B] and ropes [n, B, d/2, 2] is position k's, contiguous
    positions = torch.arange(n, device=device)[:, None].expand(n, B).contiguous()
    ropes = model.rope_fast[positions]
    table = torch.arange(B, device=device, dtype=torch.int32)[:, None] if ops.paged_fast else None  # [B, 1]
    # Fast position 0 reads the slow hidden; its logits are unused (codebook 0 is the slow token).
    x = model.fast_input(slow_hidden)[:, None]
    # No upper clamp upstream; ids past the semantic range would index out of fast_embeddings.
    code = (token0 - model.semantic_begin_id).clamp(0, cb - 1)
    frame = [token0, code]
    limit = min(FAST_LOGITS_LIMIT, cb)
    sample_codebook = ops.sample_codebook or ops.sample
    for k in range(n):
        if stack is not None:
            x = stack(x, ropes[k], stack_kv[0], stack_kv[1], k)
        else:
            pos, rope = positions[k][:, None], ropes[k][:, None]  # [B, 1], [B, 1, d/2, 2]
            mask = None if ops.paged_fast else causal_mask_from_positions(pos, L)
            for layer, c in zip(model.fast_layers, caches):
                if ops.paged_fast:
                    x = ops.fast_layer(layer, x, rope, c.k, c.v, table, positions[k])
                else:
                    x = ops.fast_layer(layer, x, rope, c.k, c.v, pos, mask)
        if k == 0:
            x = model.fast_embeddings(code)[:, None]
            continue
        logits = ops.fast_head(model, x, limit)
        ids = window.codebook_ids(k) if window is not None else None
        if ops.sample_embed is not None:  # the fused kernel: counter + k and the next input inside it
            code, nxt = ops.sample_embed(logits, params.temperature, params.top_p, penalty, ids, params.seed_lo,
                                         params.seed_hi, counter, k,
                                         model.fast_embeddings.weight if k + 1 < n else None)
            frame.append(code)
            if nxt is not None:
                x = nxt[:, None]
            continue
        code = sample_codebook(logits, params.temperature, params.top_p, penalty, ids, params.seed_lo,
                               params.seed_hi, counter + k)
        frame.append(code)
        if k + 1 < n:
            x = model.fast_embeddings(code)[:, None]
    return torch.stack(frame, dim=1)
