"""The slow token's sampling over the whole vocabulary (155,776 logits a row) without a sort: repetition penalty,
top-p, temperature and the keyed Exp(1) draw of model/sampling.py in six Triton kernels, for 16-bit logits.

The reference (`frame.sample_token_blocked`) sorts every row (a segmented sort of 155,776 per row, slow and
slower with more rows), scans it, scatters the mask back and draws with one block per row (docs/performance.md,
"Samplers"). Here
top-p's cut is found from a histogram instead. A 16-bit logit has one of 65,536 values, so a row's logits are
counted per value (its order-preserving 16-bit key), and the mass of a value is count * exp(v - max) / sum: the
sorted cumulative sum, exactly, without moving a logit. The few penalised logits (the window's ids: fp32 values
that are no 16-bit value) are kept apart and placed among the values by comparison.

Which entries top-p keeps, in the codebook sampler's words: the longest prefix of the descending order whose
cumulative mass (softmax without temperature) is <= top_p, at least the best entry, and every entry tied with the
smallest kept one. An entry of value v is kept iff mass(> v) + p(v) <= top_p, a condition that only gets easier as
v grows, so the kept set is every entry >= a cut. Equal to the sorted reference except when probabilities tie
exactly at the cut, where the reference's (unstable) sort keeps some of the tied entries and this keeps them all;
and where fp32 sums of the same probabilities in another order round across top_p.

Only entries near the row's max can be kept, so only those are counted. With m the row's max, an entry below the
floor m - ln(2V / (1 - top_p)) has mass(> it) >= 1 - V e^(floor - m) = (1 + top_p) / 2 above it, more than top_p
by a margin of (1 - top_p) / 2, far beyond fp32 rounding: it is never kept. Leaving such entries uncounted
changes only the masses computed for values below the floor, which are not kept either way; the floor is -inf for
top_p >= 0.999. A peaked row counts only its top entries (~3,300 of 155,776 for Gaussian logits of std 6) and the
draw reads only the chunks holding kept entries; a flat row (random weights) counts everything, as before. The
trained model's rows are expected to be peaked (the nucleus a few semantic tokens); none were measured here.

Kernels, grid in brackets, B rows:
1. stats [B, chunks of 2,048 logits]: the penalty, each chunk's max and sum of exp;
2. hist [B, chunks]: the row's floor, and the 16-bit value counts of the entries at or above it (integer atomics:
   the same counts in any order); a chunk whose max is below the floor reads nothing;
3. mass [B, 32 spans of 2,048 keys]: each span's probability mass (values' and penalised entries'); a span wholly
   below the floor reads no counts (they are 0);
4. cut [B, 32]: the mass above each span from the spans' masses, the scan inside the span, the span's
   smallest kept value;
5. draw [B, chunks]: the cut is the smallest of the spans'; argmax over kept entries of
   exp(x / t - max / t) / noise (the reference's probs / noise before its common division by the sum), packed
   (score bits, index) into one int64 and combined across chunks with an atomic max; a chunk whose max is below
   the cut returns at once;
6. finish [1]: the token ids from the packed maxima.
Every sum is over a fixed order of parts, so a row's token does not depend on the batch or the run. The penalty's
and the temperature's divisions round as torch's (div_rn; Triton's `/` is approximate on NVIDIA GPUs): a penalised
value is compared exactly with the 16-bit values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import next_pow2, window_ids

try:  # absent or broken Triton: the module still imports; the wrapper is then never chosen
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

CHUNK = 2048  # logits per program of the stats and draw kernels
KEYS = 65536  # the 16-bit values
SPAN = 2048  # keys per program of the mass and cut kernels
SPANS = KEYS // SPAN
_PACK_INDEX = 0x7FFFFFFF  # the packed maximum's low half holds this - index: a tie goes to the smaller index

if triton is not None:
    from .keyed_noise import exp_noise, row_key

    @triton.jit
    def _key(bits):
        # 16-bit pattern (int32 0..65535) -> order-preserving key: negatives below positives, -0 as +0
        key = tl.where(bits >= 0x8000, 0xFFFF - bits, bits + 0x8000)
        return tl.where(bits == 0x8000, 0x8000, key)

    @triton.jit
    def _value(key, BF16: tl.constexpr):
        # key (int32) -> the fp32 value of its 16-bit pattern
        bits = tl.where(key >= 0x8000, key - 0x8000, 0xFFFF - key)
        if BF16:
            return (bits << 16).to(tl.float32, bitcast=True)
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _penalised(x, idx, b, c, IDS, s_i, W, PEN, CHUNK_: tl.constexpr, WP: tl.constexpr):
        # x: fp32 logits at indices idx (chunk c) of row b -> (x with the window's ids penalised, which were). Most
        # chunks hold none of the window's ids: they skip the per-logit compares and divisions (6x the rest of the
        # stats kernel's time at 256 rows when every chunk did them)
        lane = tl.arange(0, WP)
        ids = tl.load(IDS + b.to(tl.int64) * s_i + lane, mask=lane < W, other=-1)
        mine = tl.sum(((ids >= c * CHUNK_) & (ids < c * CHUNK_ + CHUNK_)).to(tl.int32), axis=0)
        hit = idx < 0
        y = x
        if mine > 0:
            for w in range(W):
                hit = hit | (idx == tl.load(IDS + b.to(tl.int64) * s_i + w))
            pen = tl.load(PEN + b)
            y = tl.where(hit, tl.where(x < 0, x * pen, tl.math.div_rn(x, pen)), x)
        return y, hit

    @triton.jit
    def _entries(LOGITS, s_l, V, IDS, s_i, b, W, PEN, WP: tl.constexpr):
        # the window's ids of row b -> (their penalised logits [WP], which count: in range, first of their id)
        lane = tl.arange(0, WP)
        i = tl.load(IDS + b.to(tl.int64) * s_i + lane, mask=lane < W, other=-1)
        i_row = tl.load(IDS + b.to(tl.int64) * s_i + lane[None, :], mask=lane[None, :] < W, other=-1)  # [1, WP]
        earlier = tl.sum(((i[:, None] == i_row) & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
        valid = (i >= 0) & (i < V) & (earlier == 0)
        x = tl.load(LOGITS + b.to(tl.int64) * s_l + tl.where(valid, i, 0)).to(tl.float32)
        pen = tl.load(PEN + b)
        return tl.where(x < 0, x * pen, tl.math.div_rn(x, pen)), valid

    @triton.jit
    def _row_norm(STATS, b, NC, NCP: tl.constexpr):
        # the row's max and sum of exp(x - max) from its chunks' (max, sum), in chunk order
        c = tl.arange(0, NCP)
        ms = tl.load(STATS + (b * NC + c) * 2, mask=c < NC, other=float("-inf"))
        ss = tl.load(STATS + (b * NC + c) * 2 + 1, mask=c < NC, other=0.0)
        m = tl.max(ms, axis=0)
        return m, tl.sum(tl.where(ss > 0, ss * tl.exp(ms - m), 0.0), axis=0)

    @triton.jit
    def _in_span(x, s, BF16: tl.constexpr):
        # whether fp32 value x lies in span s's values: [value(first key), value(next span's first key))
        lo = _value(s * 2048, BF16)
        hi = _value(s * 2048 + 2048, BF16)
        return ((x >= lo) | (s == 0)) & ((x < hi) | (s == 31))

    @triton.jit
    def _stats_kernel(LOGITS, s_l, V, IDS, s_i, W, PEN, STATS, PACKED, NC,
                      CHUNK_: tl.constexpr, HAS_IDS: tl.constexpr, WP: tl.constexpr):
        b, c = tl.program_id(0), tl.program_id(1)
        idx = c * CHUNK_ + tl.arange(0, CHUNK_)
        inside = idx < V
        x = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=inside, other=0.0).to(tl.float32)
        if HAS_IDS:
            x, hit = _penalised(x, idx, b, c, IDS, s_i, W, PEN, CHUNK_, WP)
        x = tl.where(inside, x, float("-inf"))
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf logits: sum 0, not nan
        tl.store(STATS + (b * NC + c) * 2, m)
        tl.store(STATS + (b * NC + c) * 2 + 1, tl.sum(tl.exp(x - m_safe), axis=0))
        if c == 0:
            tl.store(PACKED + b, 0)  # the draw's atomic maximum starts from 0 (every score is > 0)

    @triton.jit
    def _floor(m, top_p, V):
        # the row's floor: no entry below it can be kept (module doc); -inf where top_p leaves too little margin
        return tl.where(top_p < 0.999, m - tl.log(2.0 * V / (1.0 - tl.minimum(top_p, 0.999))), float("-inf"))

    @triton.jit
    def _hist_kernel(LOGITS, s_l, V, IDS, s_i, W, PEN, TOP_P, STATS, COUNTS, FLOOR, NC,
                     CHUNK_: tl.constexpr, NCP: tl.constexpr, HAS_IDS: tl.constexpr, WP: tl.constexpr):
        b, c = tl.program_id(0), tl.program_id(1)
        m, _ = _row_norm(STATS, b, NC, NCP)
        floor = _floor(m, tl.load(TOP_P + b), V)
        if c == 0:
            tl.store(FLOOR + b, floor)  # the mass and cut kernels skip by this very value
        if tl.load(STATS + (b * NC + c) * 2) >= floor:  # a chunk wholly below the floor counts nothing
            idx = c * CHUNK_ + tl.arange(0, CHUNK_)
            inside = idx < V
            raw = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=inside, other=0.0)
            bits = raw.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            if HAS_IDS:
                unused, hit = _penalised(raw.to(tl.float32), idx, b, c, IDS, s_i, W, PEN, CHUNK_, WP)
            else:
                hit = idx < 0
            # penalised entries are no 16-bit value: the mass and cut kernels take them from the window
            counted = inside & (~hit) & (raw.to(tl.float32) >= floor)
            tl.atomic_add(COUNTS + b.to(tl.int64) * 65536 + _key(bits), 1, mask=counted, sem="relaxed")

    @triton.jit
    def _live(FLOOR, b, s, BF16: tl.constexpr):
        # whether span s of row b may have counts: not when its largest value is below the row's floor, which the
        # hist kernel counted nothing under (a NaN key's value: live)
        top = _value(s * 2048 + 2047, BF16)
        return (top >= tl.load(FLOOR + b)) | (top != top)

    @triton.jit
    def _span_masses(COUNTS, b, s, m, z, live, BF16: tl.constexpr):
        # span s of row b in descending key order -> (value, count, mass) per key; empty keys' mass 0. A span that
        # is not live reads no counts: they are all 0 there
        key = s * 2048 + 2047 - tl.arange(0, 2048)
        # the scalar `live` as a compare over the keys: Triton's interpreter (3.9) rejects `mask & live`
        count = tl.load(COUNTS + b.to(tl.int64) * 65536 + key, mask=key < tl.where(live, 65536, 0), other=0)
        v = _value(key, BF16)
        p = tl.exp(v - m) / z
        return v, count, tl.where(count > 0, count.to(tl.float32) * p, 0.0), p

    @triton.jit
    def _mass_kernel(LOGITS, s_l, V, IDS, s_i, W, PEN, STATS, COUNTS, FLOOR, TOTALS, NC,
                     NCP: tl.constexpr, HAS_IDS: tl.constexpr, WP: tl.constexpr, BF16: tl.constexpr):
        b, s = tl.program_id(0), tl.program_id(1)
        m, z = _row_norm(STATS, b, NC, NCP)
        v, count, mass, p = _span_masses(COUNTS, b, s, m, z, _live(FLOOR, b, s, BF16), BF16)
        total = tl.sum(mass, axis=0)
        if HAS_IDS:  # the span's penalised entries
            xs, valid = _entries(LOGITS, s_l, V, IDS, s_i, b, W, PEN, WP)
            total += tl.sum(tl.where(valid & _in_span(xs, s, BF16), tl.exp(xs - m) / z, 0.0), axis=0)
        tl.store(TOTALS + b * 32 + s, total)

    @triton.jit
    def _cut_kernel(LOGITS, s_l, V, IDS, s_i, W, PEN, TOP_P, STATS, COUNTS, FLOOR, TOTALS, CAND, NC,
                    NCP: tl.constexpr, HAS_IDS: tl.constexpr, WP: tl.constexpr, BF16: tl.constexpr):
        b, s = tl.program_id(0), tl.program_id(1)
        m, z = _row_norm(STATS, b, NC, NCP)
        top_p = tl.load(TOP_P + b)
        spans = tl.arange(0, 32)
        above = tl.sum(tl.where(spans > s, tl.load(TOTALS + b * 32 + spans), 0.0), axis=0)  # higher spans' mass
        v, count, mass, p = _span_masses(COUNTS, b, s, m, z, _live(FLOOR, b, s, BF16), BF16)
        before = tl.cumsum(mass, axis=0) - mass  # mass of this span's keys above each key
        if HAS_IDS:
            lane = tl.arange(0, WP)
            xs, valid = _entries(LOGITS, s_l, V, IDS, s_i, b, W, PEN, WP)
            ps = tl.where(valid & _in_span(xs, s, BF16), tl.exp(xs - m) / z, 0.0)  # 0: not this span's
            for w in range(W):  # the span's penalised entries above each key (element w: a masked sum, inline)
                x = tl.sum(tl.where(lane == w, xs, 0.0), axis=0)
                before += tl.where(x > v, tl.sum(tl.where(lane == w, ps, 0.0), axis=0), 0.0)
        kept = (count > 0) & (above + before + p <= top_p)
        cand = tl.min(tl.where(kept, v, float("inf")), axis=0)
        if HAS_IDS:
            for w in range(W):  # each penalised entry of this span: the same condition at its own value
                x, px = tl.sum(tl.where(lane == w, xs, 0.0), axis=0), tl.sum(tl.where(lane == w, ps, 0.0), axis=0)
                over = above + tl.sum(tl.where(v > x, mass, 0.0), axis=0) + tl.sum(tl.where(xs > x, ps, 0.0), axis=0)
                cand = tl.where((px > 0) & (over + px <= top_p), tl.minimum(cand, x), cand)
        tl.store(CAND + b * 32 + s, cand)

    @triton.jit
    def _draw_kernel(LOGITS, s_l, V, IDS, s_i, W, PEN, TEMP, SEED_LO, SEED_HI, COUNTER, STATS, CAND, PACKED, NC,
                     CHUNK_: tl.constexpr, NCP: tl.constexpr, HAS_IDS: tl.constexpr, WP: tl.constexpr):
        b, c = tl.program_id(0), tl.program_id(1)
        m, z = _row_norm(STATS, b, NC, NCP)
        cut = tl.minimum(tl.min(tl.load(CAND + b * 32 + tl.arange(0, 32)), axis=0), m)  # the best always stays
        if tl.load(STATS + (b * NC + c) * 2) >= cut:  # a chunk whose (penalised) max is below the cut keeps nothing
            idx = c * CHUNK_ + tl.arange(0, CHUNK_)
            inside = idx < V
            x = tl.load(LOGITS + b.to(tl.int64) * s_l + idx, mask=inside, other=0.0).to(tl.float32)
            if HAS_IDS:
                x, hit = _penalised(x, idx, b, c, IDS, s_i, W, PEN, CHUNK_, WP)
            t = tl.maximum(tl.load(TEMP + b), 1e-5)
            key = row_key(tl.load(SEED_LO + b), tl.load(SEED_HI + b), tl.load(COUNTER + b))
            score = tl.exp(tl.math.div_rn(x, t) - tl.math.div_rn(m, t)) / exp_noise(key, idx.to(tl.int64))
            score = tl.where(inside & (x >= cut), score, -1.0)
            best = tl.argmax(score, axis=0)
            top = tl.max(score, axis=0)
            packed = (top.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (0x7FFFFFFF - (c * CHUNK_ + best))
            tl.atomic_max(PACKED + b, packed, sem="relaxed")

    @triton.jit
    def _finish_kernel(PACKED, OUT, B, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        packed = tl.load(PACKED + r, mask=r < B, other=0)
        tl.store(OUT + r, 0x7FFFFFFF - (packed & 0xFFFFFFFF), mask=r < B)


def _check(logits: Tensor) -> Tensor:
    if logits.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"sample_vocab_triton: {logits.dtype} logits; the histogram needs 16-bit values")
    if logits.shape[1] >= _PACK_INDEX:
        raise ValueError(f"sample_vocab_triton: {logits.shape[1]} logits per row")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def _cut(logits: Tensor, top_p: Tensor, penalty: Tensor, previous_ids: Tensor | None, counter: Tensor):
    """Kernels 1-4 -> (the row arguments the draw takes, stats [B, NC, 2], span cuts [B, 32], packed [B] zeroed)."""
    B, V = logits.shape
    dev = logits.device
    ids, W = window_ids(previous_ids, counter)
    NC = triton.cdiv(V, CHUNK)
    NCP, WP, bf16 = max(16, next_pow2(NC)), max(2, next_pow2(W)), logits.dtype == torch.bfloat16
    stats = torch.empty(B, NC, 2, dtype=torch.float32, device=dev)
    counts = torch.zeros(B, KEYS, dtype=torch.int32, device=dev)
    floor = torch.empty(B, dtype=torch.float32, device=dev)
    totals = torch.empty(B, SPANS, dtype=torch.float32, device=dev)
    cand = torch.empty(B, SPANS, dtype=torch.float32, device=dev)
    packed = torch.empty(B, dtype=torch.int64, device=dev)
    row = (logits, logits.stride(0), V, ids, ids.stride(0), W, penalty.float().contiguous())
    top_p = top_p.float().contiguous()
    _stats_kernel[(B, NC)](*row, stats, packed, NC, CHUNK_=CHUNK, HAS_IDS=W > 0, WP=WP, num_warps=4)
    _hist_kernel[(B, NC)](*row, top_p, stats, counts, floor, NC, CHUNK_=CHUNK, NCP=NCP, HAS_IDS=W > 0, WP=WP,
                          num_warps=4)
    _mass_kernel[(B, SPANS)](*row, stats, counts, floor, totals, NC, NCP=NCP, HAS_IDS=W > 0, WP=WP, BF16=bf16,
                             num_warps=4)
    _cut_kernel[(B, SPANS)](*row, top_p, stats, counts, floor, totals, cand, NC, NCP=NCP, HAS_IDS=W > 0, WP=WP,
                            BF16=bf16, num_warps=4)
    return row, stats, cand, packed


def top_p_cut(logits: Tensor, top_p: Tensor, penalty: Tensor, previous_ids: Tensor | None) -> Tensor:
    """The smallest penalised logit top-p keeps in each row (fp32 [B]; every entry >= it is kept): kernels 1-4, for
    tests and diagnostics."""
    logits = _check(logits)
    _, stats, cand, _ = _cut(logits, top_p, penalty, previous_ids, top_p)
    return torch.minimum(cand.min(dim=1).values, stats[:, :, 0].max(dim=1).values)


def sample_vocab_triton(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                        previous_ids: Tensor | None, seed_lo: Tensor, seed_hi: Tensor, counter: Tensor) -> Tensor:
    """sampling.sample_token without a sort, for bf16 / fp16 logits [B, V]; previous_ids int64 [B, W] or None, the
    rest [B] -> token ids int64 [B]."""
    logits = _check(logits)
    B, V = logits.shape
    seed_lo, seed_hi, counter = seed_lo.contiguous(), seed_hi.contiguous(), counter.contiguous()  # read with stride 1
    row, stats, cand, packed = _cut(logits, top_p, penalty, previous_ids, counter)
    NC = stats.shape[1]
    _draw_kernel[(B, NC)](*row, temperature.float().contiguous(), seed_lo, seed_hi, counter, stats, cand, packed, NC,
                          CHUNK_=CHUNK, NCP=max(16, next_pow2(NC)), HAS_IDS=row[5] > 0, WP=max(2, next_pow2(row[5])),
                          num_warps=4)
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    _finish_kernel[(1,)](packed, out, B, BLOCK=max(16, next_pow2(B)), num_warps=1)
    return out
