"""bench --check-audio: whether streams delivered the audio of the codes they generated.

Under load each stream's audio is decoded in chunks, batched with other streams' chunks, through CUDA graphs whose
static buffers are reused: a row mixed up with another, or a chunk read after the wrong replay, gives every stream
plausible audio that is not its own, and no throughput figure shows it (c5cc54c fixed one such bug, above 64 rows).
Here a few streams of each level keep their codes (Plan.keep_codes); the codec decodes each text chunk whole, on
its plain module path (Vocoder.whole: no streaming state, graph or batch), and that is compared with what the
stream delivered, window by window (a wrong chunk is a few windows of a long stream: a whole-stream SNR would dilute
it). Streamed against whole decode differs by the dtype's rounding only: in bf16 on a CPU the worst window was
~20 dB with the tiny test codec and ~39 dB at S1-mini's shapes (random weights; not yet measured on a GPU), fp32
over 100 dB; another stream's audio scores ~-3 dB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_SNR_DB = 10.0  # below this in any window a stream's audio is not its codes' audio
CAP_DB = 200.0  # identical audio: the SNR is reported as this (JSON has no infinity)
WINDOW = 4096  # samples a window: two frames
QUIET = 0.1  # a window's signal power counts as at least this share of the stream's mean (silences: no 0 / 0)


@dataclass(frozen=True)
class AudioCheck:
    snr_db: float  # delivered vs whole decode, the worst window of the common length, within +-CAP_DB
    samples: int  # delivered
    expected: int  # the whole decode's

    @property
    def ok(self) -> bool:
        return self.samples == self.expected and self.snr_db >= MIN_SNR_DB


def snr_db(got: np.ndarray, want: np.ndarray, window: int = WINDOW) -> float:
    """The lowest over windows of 10 log10(signal / noise): `want`'s power in the window (at least QUIET times its
    mean over the common length) over the power of got - want there; within +-CAP_DB."""
    n = min(len(got), len(want))
    if n == 0:
        return CAP_DB
    g, w = got[:n].astype(np.float64), want[:n].astype(np.float64)
    floor = QUIET * float(np.mean(w * w))
    worst = CAP_DB
    for start in range(0, n, window):
        sl = slice(start, start + window)
        noise = float(np.mean((g[sl] - w[sl]) ** 2))
        signal = max(float(np.mean(w[sl] ** 2)), floor)
        if noise > 0.0:
            worst = min(worst, -CAP_DB if signal == 0.0 else 10 * math.log10(signal / noise))
    return max(-CAP_DB, worst)


def compare(delivered: np.ndarray, whole: np.ndarray) -> AudioCheck:
    return AudioCheck(snr_db(delivered, whole), len(delivered), len(whole))


def sampled(n: int, count: int) -> list[int]:
    """`count` of the indices 0..n-1, spread evenly, the first and the last among them (all of them if fewer)."""
    if count <= 0 or n <= 0:
        return []
    if count >= n:
        return list(range(n))
    if count == 1:
        return [0]
    return sorted({round(i * (n - 1) / (count - 1)) for i in range(count)})
