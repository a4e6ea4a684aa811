"""Sampling, batched and free of host syncs: logits -> probabilities (S1 spec §6.3) -> token.

Every row carries its own temperature / top-p / penalty, and its own random stream: the noise for a
row is a hash of (request seed, sample counter, vocab index), so a request draws the same tokens
whether it runs alone or inside any batch, and on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import compiling

_M32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row parameters [B] on the sampling device."""

    temperature: Tensor  # float32 [B]
    top_p: Tensor  # float32 [B]
    repetition_penalty: Tensor  # float32 [B]
    seed_lo: Tensor  # int64 [B], low 32 bits of the seed
    seed_hi: Tensor  # int64 [B], high 32 bits

    @staticmethod
    def from_values(rows: list[tuple[float, float, float, int]], device) -> SamplingTensors:
        """rows: (temperature, top_p, repetition_penalty, seed) per request."""
        t, p, r, s = zip(*rows)
        seeds = [x % (1 << 64) for x in s]

        def put(values, dtype):  # non-blocking: staged at once, no wait for the device's queued work
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return SamplingTensors(
            temperature=put(t, torch.float32), top_p=put(p, torch.float32),
            repetition_penalty=put(r, torch.float32),
            seed_lo=put([x & _M32 for x in seeds], torch.int64), seed_hi=put([x >> 32 for x in seeds], torch.int64),
        )


def apply_repetition_penalty(logits: Tensor, ids: Tensor, penalty: Tensor) -> Tensor:
    # logits: [B, V], ids: [B, W] (duplicates harmless), penalty: [B] -> [B, V]
    score = logits.gather(-1, ids)
    p = penalty[:, None].to(score.dtype)
    score = torch.where(score < 0, score * p, score / p)
    return logits.scatter(-1, ids, score)


def logits_to_probs(logits: Tensor, temperature: Tensor, top_p: Tensor, penalty: Tensor,
                    previous_ids: Tensor | None = None, scan_block: int = 0) -> Tensor:
    """logits: [B, V] -> probs [B, V] float32: penalty, then top-p on the penalised logits (softmax
    without temperature, always keep the best), then divide by temperature, softmax."""
    logits = logits.float()
    if previous_ids is not None:
        logits = apply_repetition_penalty(logits, previous_ids, penalty)
    logits = (_TOP_P_OP if _TOP_P_OP is not None and compiling() else top_p_filter)(logits, top_p, scan_block)
    return torch.softmax(logits / temperature.clamp(min=1e-5)[:, None], dim=-1)


SCAN_BLOCK = 1024  # columns per block of blocked_cumsum (the slow vocabulary: 153 blocks a row)


def blocked_cumsum(x: Tensor, block: int) -> Tensor:
    """x: [B, V] -> cumsum over V, computed per block of `block` columns plus each block's offset: the same
    sums in another order (fp32 rounding differs), but B * V / block GPU blocks work at once where torch's
    scan gives a row one (155,776 columns: slow whatever the batch; docs/performance.md, "Samplers")."""
    B, V = x.shape
    inner = F.pad(x, (0, -V % block)).view(B, -1, block).cumsum(-1)  # [B, blocks, block]
    offsets = F.pad(inner[:, :-1, -1].cumsum(-1), (1, 0))  # [B, blocks]: the sum of the blocks before
    return (inner + offsets[:, :, None]).view(B, -1)[:, :V]


def top_p_filter(logits: Tensor, top_p: Tensor, scan_block: int = 0) -> Tensor:
    """logits: float [B, V]; top_p: [B] -> logits with everything outside each row's nucleus at -inf
    (cumulative softmax without temperature > top_p is dropped; the best entry always stays).
    scan_block > 0: the cumulative sum in blocks (blocked_cumsum) when V is wider than a block."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    V = probs.shape[-1]
    cum = blocked_cumsum(probs, scan_block) if 0 < scan_block < V else probs.cumsum(dim=-1)
    drop_sorted = cum > top_p[:, None]
    drop_sorted[:, 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


_TOP_P_OP = None


def register_top_p_op() -> None:
    """Makes logits_to_probs call top_p_filter as an opaque custom op (torch >= 2.4). Call before
    torch.compile traces sampling: Inductor's scan codegen fails on a cumsum over a 155,776-wide
    vocabulary with a dynamic batch (torch 2.11), and ATen's segmented sort is what we want there.
    Same numbers either way."""
    global _TOP_P_OP
    import torch.library

    if _TOP_P_OP is None and hasattr(torch.library, "custom_op"):
        op = torch.library.custom_op("ttsengine::top_p_filter", mutates_args=())(top_p_filter)
        op.register_fake(lambda logits, top_p, scan_block=0: torch.empty_like(logits))
        _TOP_P_OP = op


def _mul32(x: Tensor, c: int) -> Tensor:
    # (x * c) mod 2^32 for 0 <= x < 2^32, split in 16-bit halves so int64 never overflows
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    # murmur3's 32-bit finaliser: a bijection that spreads every input bit over the output
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def exponential_noise(seed_lo: Tensor, seed_hi: Tensor, counter: Tensor, n: int) -> Tensor:
    """Exp(1) noise [B, n] from a counter-based hash: row b's values depend only on
    (seed_b, counter_b, index). seed_lo/seed_hi/counter: int64 [B]."""
    key = _mix32(seed_lo ^ 0x9E3779B9)
    key = _mix32(key ^ seed_hi)
    key = _mix32(key ^ (counter & _M32))  # [B]
    idx = torch.arange(n, device=seed_lo.device, dtype=torch.int64)
    x = _mix32((key[:, None] + _mul32(idx, 0x9E3779B9)[None, :]) & _M32)
    x = _mix32(x ^ 0x5BD1E995)
    # uniform in (0, 1): 24 bits + half a step. The top value, 1 - 2^-25, rounds to 1.0 in fp32 (a tie, to even),
    # whose noise -log(1) = -0 made probs / noise 0/0 = nan for an entry top-p dropped, and argmax takes nan: one
    # slow token in ~110 came from outside top-p (2^-24 per entry, 155,776 entries). Capped at 1 - 2^-24, the largest
    # fp32 below 1: that entry's noise is then the smallest, as its hash says (every other value is unchanged)
    u = ((x >> 8).to(torch.float32) * (2.0**-24) + 2.0**-25).clamp(max=1.0 - 2.0**-24)
    return -torch.log(u)


def draw(probs: Tensor, noise: Tensor) -> Tensor:
    # probs, noise: [B, V] -> [B] int64; argmax(p / q) with q ~ Exp(1) is a draw from p
    return torch.argmax(probs / noise, dim=-1)


@dataclass
class RepetitionWindow:
    """Upstream's penalty window (spec §6.3) as a per-row ring of the last `size` recorded frames.

    Slow logits are penalised at the ids in the window's first column (the oldest recorded frame,
    all n+1 rows; zeros before anything is recorded); codebook k at the ids in window row k+1.
    """

    frames: Tensor  # int64 [B, n+1, size]
    count: Tensor  # int64 [B], frames recorded per row

    @staticmethod
    def empty(batch: int, rows: int, size: int, device) -> RepetitionWindow:
        return RepetitionWindow(torch.zeros(batch, rows, size, dtype=torch.int64, device=device),
                                torch.zeros(batch, dtype=torch.int64, device=device))

    @property
    def size(self) -> int:
        return self.frames.shape[2]

    def view(self, rows: int) -> RepetitionWindow:
        """The first `rows` rows, sharing storage (updates land in this window)."""
        return RepetitionWindow(self.frames[:rows], self.count[:rows])

    def slow_ids(self) -> Tensor:
        # [B, n+1]: while fewer than `size` frames are recorded, upstream's window starts at column 0
        oldest = torch.where(self.count < self.size, torch.zeros_like(self.count), self.count % self.size)
        idx = oldest[:, None, None].expand(-1, self.frames.shape[1], 1)
        return self.frames.gather(2, idx).squeeze(2)

    def codebook_ids(self, k: int) -> Tensor:
        return self.frames[:, k + 1, :]  # [B, W]; order does not matter to the penalty

    def record(self, frame: Tensor, active: Tensor | None = None) -> None:
        # frame: [B, n+1]; active: bool [B] rows whose frame counts (None = all)
        col = (self.count % self.size)[:, None, None].expand(-1, self.frames.shape[1], 1)
        new = self.frames.scatter(2, col, frame[:, :, None])
        if active is None:
            self.frames.copy_(new)
            self.count.add_(1)
        else:
            self.frames.copy_(torch.where(active[:, None, None], new, self.frames))
            self.count.add_(active.to(torch.int64))

    def reset_rows(self, rows: Tensor) -> None:
        # rows: bool [B]; forget the history of rows that now hold a new request
        self.frames.masked_fill_(rows[:, None, None], 0)
        self.count.masked_fill_(rows, 0)
