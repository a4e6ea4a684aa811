"""Tempo change without pitch change (WSOLA), streaming: audio in, audio out, chunk by chunk.

Each output hop takes an input frame near the nominal position (k * speed * hop), shifted within
a small tolerance to the offset whose waveform best continues the previous frame (cross-correlation),
and overlap-adds it with a Hann window. Streamed output equals processing the whole signal at once.
"""

from __future__ import annotations

import numpy as np


class TimeStretch:
    def __init__(self, speed: float, rate: int, frame_ms: float = 40.0):
        """speed > 1 is faster (shorter audio); rate: samples per second of the input."""
        if not 0.25 <= speed <= 4.0:
            raise ValueError(f"speed {speed} is outside 0.25..4.0")
        self.speed = speed
        n = 1 << int(np.round(np.log2(rate * frame_ms / 1000)))  # power-of-two frame
        self.n, self.hop = n, n // 2
        self.tol = n // 4
        self.window = np.hanning(n + 1)[:-1].astype(np.float32)  # periodic: hops of n/2 sum to 1
        self.buf = np.zeros(self.tol, dtype=np.float32)  # input, with `tol` zeros of history in front
        self.start = -self.tol  # input index of buf[0]
        self.k = 0  # next output frame
        self.prev: int | None = None  # input index where the previous frame started
        self.acc = np.zeros(n, dtype=np.float32)  # output samples not yet final
        self.done_input = False
        self.received = 0  # input samples fed
        self.emitted = 0  # output samples returned
        self.target: int | None = None  # total output length, known once the input ended

    def _take(self, k: int) -> np.ndarray | None:
        """Input frame for output frame k, or None if more input is needed."""
        nominal = int(round(k * self.hop * self.speed))
        lo, hi = nominal - self.tol, nominal + self.tol + self.n
        nat = None if self.prev is None else self.prev + self.hop  # where the previous frame continues
        need = hi if nat is None else max(hi, nat + self.n)
        end = self.start + len(self.buf)
        if need > end:
            if not self.done_input:
                return None
            self.buf = np.concatenate([self.buf, np.zeros(need - end, dtype=np.float32)])  # silence after the end
        region = self.buf[lo - self.start:hi - self.start]
        if nat is None:
            best = nominal
        else:
            template = self.buf[nat - self.start:nat + self.n - self.start]
            score = np.correlate(region, template, mode="valid")  # 2 * tol + 1 offsets
            best = lo + int(np.argmax(score))
        self.prev = best
        return self.buf[best - self.start:best - self.start + self.n]

    def _run(self) -> np.ndarray:
        out = []
        while self.target is None or self.emitted < self.target:
            frame = self._take(self.k)
            if frame is None:
                break
            self.acc += self.window * frame
            hop = self.acc[: self.hop].copy()
            if self.target is not None:
                hop = hop[: self.target - self.emitted]
            out.append(hop)
            self.emitted += len(hop)
            self.acc = np.concatenate([self.acc[self.hop:], np.zeros(self.hop, np.float32)])
            self.k += 1
            # drop input that no later frame can reach
            keep_from = min(int(round(self.k * self.hop * self.speed)) - self.tol, self.prev + self.hop) - 1
            if keep_from > self.start:
                self.buf = self.buf[keep_from - self.start:]
                self.start = keep_from
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def process(self, x: np.ndarray) -> np.ndarray:
        """Feeds input samples -> the output samples that are now final."""
        self.buf = np.concatenate([self.buf, np.asarray(x, dtype=np.float32)])
        self.received += len(x)
        return self._run()

    def flush(self) -> np.ndarray:
        """The rest of the output: round(input length / speed) samples in all."""
        self.done_input = True
        self.target = int(round(self.received / self.speed))
        return self._run()
