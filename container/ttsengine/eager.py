"""The eager reference engine: one request at a time, whole text chunks, whole-chunk codec decode.

Every fast path (batching, CUDA graphs, compile, streaming decode) is tested equal to this.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from .config import EngineConfig
from .engine.loader import load
from .errors import no_audio
from .model.generation import Generation, raw_frames
from .model.loading.checkpoint import Checkpoint
from .model.sampling import SamplingTensors
from .synthesis.output import AudioChunk, SynthesisResult
from .synthesis.plan import ChunkReport, Plan, Planner
from .synthesis.request import SynthesisRequest

log = logging.getLogger(__name__)


class EagerEngine:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig):
        self.ckpt, self.config = checkpoint, config
        self.planner = Planner(checkpoint, config)
        self.device = checkpoint.model.norm.weight.device
        self._lock = threading.Lock()

    @classmethod
    def load(cls, config: EngineConfig) -> EagerEngine:
        return cls(load(config), config)

    @property
    def sample_rate(self) -> int:
        return self.ckpt.codec.sample_rate

    @property
    def voice_encoder(self):
        return self.planner.voice_encoder

    def start(self, request: SynthesisRequest) -> Plan:
        return self.planner.plan(request)

    def stream(self, request: SynthesisRequest | Plan) -> Iterator[AudioChunk]:
        return self._chunks(self.planner.plan(request))

    def synthesize(self, request: SynthesisRequest | Plan) -> SynthesisResult:
        plan = self.planner.plan(request)
        parts = list(self._chunks(plan))
        return SynthesisResult.join(parts, self.sample_rate, plan.seed, plan.reports)

    def _chunks(self, plan: Plan) -> Iterator[AudioChunk]:
        with self._lock:
            previous: tuple[str, Tensor] | None = None
            offset = 0
            for i, text in enumerate(plan.texts):
                codes, generated = self._generate_chunk(plan, i, previous, offset)
                offset += generated
                previous = (text, codes)
                if codes.shape[1]:
                    yield AudioChunk(self.audio_from_codes(codes), self.sample_rate, len(plan.reports) - 1, i)
            if not plan.frames:
                raise no_audio()

    def _generate_chunk(self, plan: Plan, index: int, previous: tuple[str, Tensor] | None,
                        frame_offset: int) -> tuple[Tensor, int]:
        """-> (codes int64 [n, N] on CPU, frames generated incl. the dropped last one)."""
        prompt, dropped = self.planner.chunk_prompt(plan, index, previous)
        req = plan.request
        im_end = -1 if plan.ignore_stop else self.ckpt.tokenizer.im_end_id
        params = SamplingTensors.from_values([(req.temperature, req.top_p, req.repetition_penalty, req.seed)],
                                             self.device)
        gen = Generation(raw_frames(self.ckpt.model, prompt, params, self.planner.budget(prompt, plan), im_end,
                                    self.planner.rules.penalty_window, frame_offset), im_end)
        with torch.inference_mode():
            frames = list(gen)
        n = self.ckpt.config.num_codebooks
        codes = torch.stack(frames, dim=1)[1:].cpu() if frames else torch.zeros(n, 0, dtype=torch.int64)
        plan.reports.append(ChunkReport(plan.texts[index], codes.shape[1], gen.finish_reason or "length", dropped,
                                        prompt.shape[1]))
        return codes, gen.generated

    def audio_from_codes(self, codes: Tensor) -> np.ndarray:
        """codes: int64 [n, N] -> float32 [N * frame_length]."""
        with torch.inference_mode():
            wave = self.ckpt.codec.decode(codes[None].to(self.device))
        return wave[0, 0].float().cpu().numpy()
