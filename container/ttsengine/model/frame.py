"""One frame from the slow model's output: sample the slow token, then run the fast transformer
codebook by codebook (S1 spec §6.2). Batched, no host sync; the same function serves the eager
reference and the graphed GPU step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dual_ar import DualAR
from .layers import KVCache, causal_mask_from_positions
from .sampling import RepetitionWindow, SamplingTensors, draw, exponential_noise, logits_to_probs

# Upstream samples residual codebooks from the first 1024 fast logits only (the codec's codebooks
# have 1024 entries); with a smaller codebook the cut is a no-op.
FAST_LOGITS_LIMIT = 1024


def sample_frame(model: DualAR, slow_logits: Tensor, slow_hidden: Tensor, params: SamplingTensors,
                 frame_index: Tensor, fast_caches: list[KVCache], window: RepetitionWindow | None) -> Tensor:
    """slow_logits: [B, V], slow_hidden: [B, D] (pre-norm), frame_index: int64 [B] (the row's frame
    counter, keys its random stream) -> frame [B, n+1] int64 = [token0, code_0 .. code_{n-1}].

    `window` None means no repetition penalty (upstream's first frame); rows that should not be
    penalised inside a batch use penalty 1.0, which is an exact no-op."""
    n, cb = model.cfg.num_codebooks, model.cfg.codebook_size
    B = slow_logits.shape[0]
    counter = frame_index * n

    probs = logits_to_probs(slow_logits, params.temperature, params.top_p, params.repetition_penalty,
                            window.slow_ids() if window is not None else None)
    token0 = draw(probs, exponential_noise(params.seed_lo, params.seed_hi, counter, probs.shape[-1]))

    # Fast position 0 reads the slow hidden; its logits are unused (codebook 0 is the slow token).
    pos = torch.zeros(B, 1, dtype=torch.int64, device=slow_logits.device)
    model.fast_forward(model.fast_input(slow_hidden)[:, None], pos, causal_mask_from_positions(pos, 1),
                       fast_caches, kv_len=1, head=False)
    # No upper clamp upstream; ids past the semantic range would index out of fast_embeddings.
    code = (token0 - model.semantic_begin_id).clamp(0, cb - 1)
    frame = [token0, code]
    limit = min(FAST_LOGITS_LIMIT, cb)
    for k in range(1, n):
        pos = torch.full((B, 1), k, dtype=torch.int64, device=slow_logits.device)
        logits = model.fast_forward(model.fast_embeddings(code)[:, None], pos,
                                    causal_mask_from_positions(pos, k + 1), fast_caches, kv_len=k + 1)
        probs = logits_to_probs(logits[:, 0, :limit], params.temperature, params.top_p,
                                params.repetition_penalty, window.codebook_ids(k) if window is not None else None)
        code = draw(probs, exponential_noise(params.seed_lo, params.seed_hi, counter + k, limit))
        frame.append(code)
    return torch.stack(frame, dim=1)
