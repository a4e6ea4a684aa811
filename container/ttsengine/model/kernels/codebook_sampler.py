"""A codebook's token from its logits in one Triton kernel: repetition penalty, top-p, temperature and the
keyed Exp(1) draw of model/sampling.py, one program per row; optionally the fast transformer's next input (the
token's embedding row) from the same program.

The reference (`sampling.sample_token`) runs ~15 kernels per codebook (cast, gather/scatter of the penalty,
a sort, softmax + cumsum, the mask scattered back, a second softmax, the noise hash, argmax); the fast
transformer samples 9 codebooks per frame, so at one stream these launches cost more than their math. A
codebook row (<= 4096 logits) fits one program's registers, so everything happens there.

Same math, same order of operations, in fp32:
- penalty: ids in the row's window (duplicates harmless) get score * p if < 0 else score / p;
- top-p: sort the probabilities, take the cumulative mass, keep the longest prefix whose mass <= top_p (at least
  the best entry); an entry is kept iff its probability is >= the smallest kept one. Equal to the sorted reference
  except when two probabilities tie exactly at the cut, where the reference's (unstable) sort picks some of them
  and this keeps all. (A sort-free search for the cut over the probabilities' 32-bit keys, 16 thresholds a round,
  measured several times slower than the whole kernel with the sort: not used; docs/performance.md, "Samplers");
- the draw: argmax(softmax(kept / temperature) / noise) with the reference's counter-based noise (the row's counter
  plus the codebook's offset `k`: the reference's `counter + k`, without its own kernel).
With an embedding table the program also writes table[token] as the row of the next fast position's input, and with
PDL (kernels/launch.py) it is launched while the fast head still runs: the kernel after it (the first fast layer's
QKV projection) then loads its weights while this one samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .launch import gdc_ops, launch_options
from .triton_support import next_pow2, window_ids

try:  # absent or broken Triton: the module still imports; the wrapper is then never chosen
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

MAX_LOGITS = 4096
NUM_WARPS = 8  # warps per row's program: the fastest count measured, the same tokens at every count
# (scripts/device/codebook_sampler_bench.py; docs/performance.md, "Samplers")

if triton is not None:
    from .keyed_noise import exp_noise, row_key

    _gdc_wait, _gdc_launch_dependents = gdc_ops()  # None where Triton has no grid dependency control (PDL never runs)

    @triton.jit
    def _top_p_cut(p, top_p, BLOCK: tl.constexpr):
        # p: fp32 probabilities [BLOCK] (>= 0) -> the smallest kept probability: keep p >= cut
        ranked = tl.sort(p, descending=True)
        cum = tl.cumsum(ranked, axis=0)
        kept = tl.maximum(tl.sum((cum <= top_p).to(tl.int32), axis=0), 1)  # ranks [0, kept) stay
        return tl.min(tl.where(tl.arange(0, BLOCK) < kept, ranked, float("inf")), axis=0)

    @triton.jit
    def _kernel(LOGITS, s_l, V, TEMP, TOP_P, PEN, IDS, s_i, W, SEED_LO, SEED_HI, COUNTER, K_OFF, OUT, s_o,
                EMB, s_e, X, s_x, D,
                BLOCK: tl.constexpr, WP: tl.constexpr, HAS_IDS: tl.constexpr, EMBED: tl.constexpr,
                BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
        # one program per row; every step in fp32 registers
        if PDL:
            _gdc_wait()  # the fast head's logits are complete and visible
            _gdc_launch_dependents()  # the next kernel may start loading its weights
        b = tl.program_id(0)
        idx = tl.arange(0, BLOCK)
        inside = idx < V
        x = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=inside, other=float("-inf")).to(tl.float32)
        if HAS_IDS:
            lane = tl.arange(0, WP)
            ids = tl.load(IDS + b.to(tl.int64) * s_i + lane, mask=lane < W, other=-1)  # the window at once
            hit = tl.max((idx[None, :] == ids[:, None]).to(tl.int32), axis=0) > 0
            pen = tl.load(PEN + b)
            x = tl.where(hit & inside, tl.where(x < 0, x * pen, tl.math.div_rn(x, pen)), x)
        # top-p on the penalised logits, without temperature (the reference's order)
        e = tl.exp(x - tl.max(x, axis=0))
        p = e / tl.sum(e, axis=0)
        x = tl.where(p >= _top_p_cut(p, tl.load(TOP_P + b), BLOCK), x, float("-inf"))
        # temperature, softmax, keyed draw
        t = tl.maximum(tl.load(TEMP + b), 1e-5)
        y = tl.math.div_rn(x, t)
        e = tl.exp(y - tl.max(y, axis=0))
        probs = e / tl.sum(e, axis=0)
        key = row_key(tl.load(SEED_LO + b), tl.load(SEED_HI + b), tl.load(COUNTER + b) + K_OFF)
        score = tl.where(inside, probs / exp_noise(key, idx.to(tl.int64)), -1.0)
        token = tl.argmax(score, axis=0).to(tl.int64)
        tl.store(OUT + b.to(tl.int64) * s_o, token)
        if EMBED:  # the next fast position's input: the token's embedding row
            for d0 in range(0, D, BLOCK_D):
                d = d0 + tl.arange(0, BLOCK_D)
                row = tl.load(EMB + token * s_e + d, mask=d < D)
                tl.store(X + b.to(tl.int64) * s_x + d, row, mask=d < D)

    @triton.jit
    def _cut_kernel(LOGITS, s_l, V, TOP_P, OUT, BLOCK: tl.constexpr):
        # the smallest kept logit of each row (unpenalised logits): what the sampler keeps, for tests
        b = tl.program_id(0)
        idx = tl.arange(0, BLOCK)
        x = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        p = e / tl.sum(e, axis=0)
        kept = (p >= _top_p_cut(p, tl.load(TOP_P + b), BLOCK)) & (idx < V)
        tl.store(OUT + b, tl.min(tl.where(kept, x, float("inf")), axis=0))


def top_p_cut(logits: Tensor, top_p: Tensor) -> Tensor:
    """The smallest logit the sampler keeps per row (fp32 [B]): its top-p rule alone, for tests (logits [B, V])."""
    logits = _check(logits)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    _cut_kernel[(logits.shape[0],)](logits, logits.stride(0), logits.shape[1], top_p.float().contiguous(), out,
                                    BLOCK=max(16, next_pow2(logits.shape[1])), num_warps=4)
    return out


def _check(logits: Tensor) -> Tensor:
    V = logits.shape[1]
    if V > MAX_LOGITS:
        raise ValueError(f"sample_codebook_triton: {V} logits per row; the kernel holds at most {MAX_LOGITS}")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def sample_codebook_triton(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                           previous_ids: Tensor | None, seed_lo: Tensor, seed_hi: Tensor, counter: Tensor) -> Tensor:
    """sampling.sample_token for rows of at most 4,096 logits: logits [B, V] (last dim contiguous),
    previous_ids int64 [B, W] or None, the rest [B] -> token ids int64 [B]."""
    return sample_codebook_embed(logits, temperature, top_p, penalty, previous_ids, seed_lo, seed_hi, counter)[0]


def sample_codebook_embed(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                          previous_ids: Tensor | None, seed_lo: Tensor, seed_hi: Tensor, counter: Tensor,
                          offset: int = 0, table: Tensor | None = None,
                          pdl: bool = False) -> tuple[Tensor, Tensor | None]:
    """sample_codebook_triton with the row's counter + `offset` keying its noise, and with `table` ([N, D], last dim
    contiguous, N > every token) also the tokens' rows of it: -> (token ids int64 [B], table[tokens] [B, D] or
    None). pdl: launched as a programmatic dependent where the GPU has it (the caller's kernels before and after
    it follow launch.py's contract)."""
    logits = _check(logits)
    B, V = logits.shape
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    ids, W = window_ids(previous_ids, counter)
    embed = table is not None
    if embed and table.stride(1) != 1:
        raise ValueError("sample_codebook_embed: the embedding table's rows must be contiguous")
    x = torch.empty(B, table.shape[1], dtype=table.dtype, device=logits.device) if embed else out
    emb = table if embed else out
    D = table.shape[1] if embed else 0
    _kernel[(B,)](logits, logits.stride(0), V, temperature.float().contiguous(), top_p.float().contiguous(),
                  penalty.float().contiguous(), ids, ids.stride(0), W, seed_lo.contiguous(), seed_hi.contiguous(),
                  counter.contiguous(), offset, out, out.stride(0), emb, emb.stride(0), x, x.stride(0), D,
                  BLOCK=max(16, next_pow2(V)), WP=max(2, next_pow2(W)), HAS_IDS=previous_ids is not None,
                  EMBED=embed, BLOCK_D=min(1024, max(16, next_pow2(D))), num_warps=NUM_WARPS,
                  **launch_options(pdl, logits.device))
    return out, x if embed else None
