"""What the engines hand back: audio chunks while streaming, a result when done."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import ChunkReport


@dataclass(frozen=True)
class AudioChunk:
    audio: np.ndarray  # float32 [L], mono, at sample_rate
    sample_rate: int
    index: int  # position in the stream
    text_index: int  # which text chunk it belongs to


@dataclass(frozen=True)
class SynthesisResult:
    audio: np.ndarray  # float32 [L]
    sample_rate: int
    seed: int
    chunks: tuple[ChunkReport, ...]

    @property
    def frames(self) -> int:
        return sum(c.frames for c in self.chunks)

    @staticmethod
    def join(parts: list[AudioChunk], sample_rate: int, seed: int, reports: list[ChunkReport]) -> SynthesisResult:
        audio = np.concatenate([p.audio for p in parts]) if parts else np.zeros(0, dtype=np.float32)
        return SynthesisResult(audio, sample_rate, seed, tuple(reports))
