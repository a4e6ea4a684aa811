"""A codebook's token from its logits in one Triton kernel: repetition penalty, top-p, temperature and the
keyed Exp(1) draw of model/sampling.py, one program per row.

The reference (`sampling.sample_token`) runs ~15 kernels per codebook (cast, gather/scatter of the penalty,
a sort, softmax + cumsum, the mask scattered back, a second softmax, the noise hash, argmax); the fast
transformer samples 9 codebooks per frame, so at one stream these launches cost more than their math. A
codebook row (<= 1024 logits) fits one program's registers, so everything happens there.

Same math, same order of operations, in fp32:
- penalty: ids in the row's window (duplicates harmless) get score * p if < 0 else score / p;
- top-p without scattering a sorted mask back: sort the probabilities, take the cumulative mass, keep the
  longest prefix whose mass <= top_p (at least the best entry); an entry is kept iff its probability is >=
  the smallest kept one. Equal to the sorted reference except when two probabilities tie exactly at the
  cut, where the reference's (unstable) sort picks some of them and this keeps all;
- the draw: argmax(softmax(kept / temperature) / noise) with the reference's counter-based noise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import next_pow2

try:  # absent or broken Triton: the module still imports; the wrapper is then never chosen
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

if triton is not None:
    from .keyed_noise import exp_noise, row_key

    @triton.jit
    def _kernel(LOGITS, s_l, V, TEMP, TOP_P, PEN, IDS, s_i, W, SEED_LO, SEED_HI, COUNTER, OUT,
                BLOCK: tl.constexpr, HAS_IDS: tl.constexpr):
        # one program per row; every step in fp32 registers
        b = tl.program_id(0)
        idx = tl.arange(0, BLOCK)
        inside = idx < V
        x = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=inside, other=float("-inf")).to(tl.float32)
        if HAS_IDS:
            pen = tl.load(PEN + b)
            hit = idx < 0
            for w in range(W):
                hit = hit | (idx == tl.load(IDS + b.to(tl.int64) * s_i + w))
            x = tl.where(hit & inside, tl.where(x < 0, x * pen, x / pen), x)
        # top-p on the penalised logits, without temperature (the reference's order)
        e = tl.exp(x - tl.max(x, axis=0))
        p = e / tl.sum(e, axis=0)
        ranked = tl.sort(p, descending=True)
        cum = tl.cumsum(ranked, axis=0)
        kept = tl.maximum(tl.sum((cum <= tl.load(TOP_P + b)).to(tl.int32), axis=0), 1)  # ranks [0, kept) stay
        cut = tl.min(tl.where(idx < kept, ranked, float("inf")), axis=0)
        x = tl.where(p >= cut, x, float("-inf"))
        # temperature, softmax, keyed draw
        t = tl.maximum(tl.load(TEMP + b), 1e-5)
        y = x / t
        e = tl.exp(y - tl.max(y, axis=0))
        probs = e / tl.sum(e, axis=0)
        key = row_key(tl.load(SEED_LO + b), tl.load(SEED_HI + b), tl.load(COUNTER + b))
        score = tl.where(inside, probs / exp_noise(key, idx.to(tl.int64)), -1.0)
        tl.store(OUT + b, tl.argmax(score, axis=0).to(tl.int64))


def sample_codebook_triton(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                           previous_ids: Tensor | None, seed_lo: Tensor, seed_hi: Tensor, counter: Tensor) -> Tensor:
    """sampling.sample_token for rows of at most 4,096 logits: logits [B, V] (last dim contiguous),
    previous_ids int64 [B, W] or None, the rest [B] -> token ids int64 [B]."""
    B, V = logits.shape
    if V > 4096:
        raise ValueError(f"sample_codebook_triton: {V} logits per row; the kernel holds at most 4096")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    ids = previous_ids if previous_ids is not None else counter  # any int64 tensor: unread without ids
    if ids.dim() == 2 and ids.stride(1) != 1:  # the kernel walks a row's ids with stride 1
        ids = ids.contiguous()
    W = previous_ids.shape[1] if previous_ids is not None else 0
    _kernel[(B,)](logits, logits.stride(0), V, temperature.float().contiguous(), top_p.float().contiguous(),
                    penalty.float().contiguous(), ids, ids.stride(0), W, seed_lo, seed_hi, counter, out,
                    BLOCK=max(16, next_pow2(V)), HAS_IDS=previous_ids is not None, num_warps=4)
    return out
