"""The eager engine: load a model directory once, turn requests into audio.

Long texts are split into sentence chunks generated in order; each chunk's prompt carries the
references and the previous chunk's text + codes, so the voice stays the same across chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..config import EngineConfig
from ..errors import InputError
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.prompt import check_codes
from ..model.sampling import SamplingTensors
from .generator import Generation, frame_budget, raw_frames
from .references import ReferenceEncoder
from .request import ResolvedRequest, SynthesisRequest, resolve
from .text_chunks import split_text

log = logging.getLogger(__name__)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"TTS_DEVICE={name}: CUDA is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device, default_cuda: torch.dtype) -> torch.dtype:
    if name == "auto":
        return default_cuda if device.type == "cuda" else torch.float32
    return _DTYPES[name]


@dataclass(frozen=True)
class AudioChunk:
    audio: np.ndarray  # float32 [L], mono, at sample_rate
    sample_rate: int
    index: int  # position in the stream
    text_index: int  # which text chunk it belongs to


@dataclass(frozen=True)
class ChunkReport:
    text: str
    frames: int
    finish_reason: str  # "stop" (the model ended the utterance) | "length" (max_new_tokens reached)
    context_dropped: bool  # the previous chunk did not fit beside this one as context
    prompt_tokens: int


@dataclass(frozen=True)
class SynthesisResult:
    audio: np.ndarray  # float32 [L]
    sample_rate: int
    seed: int
    chunks: tuple[ChunkReport, ...]

    @property
    def frames(self) -> int:
        return sum(c.frames for c in self.chunks)


@dataclass
class Synthesis:
    """A started request: validated at creation (errors raise before any audio), then iterated for
    audio chunks. `reports` fills in as chunks finish."""

    engine: Engine
    request: ResolvedRequest
    references: list[tuple[str, Tensor]]
    texts: list[str]
    reports: list[ChunkReport] = field(default_factory=list)

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    def __iter__(self) -> Iterator[AudioChunk]:
        with self.engine._lock:
            previous: tuple[str, Tensor] | None = None
            offset = 0
            for i, text in enumerate(self.texts):
                codes, report, generated = self.engine._generate_chunk(self.request, text, self.references,
                                                                       previous, offset)
                offset += generated
                self.reports.append(report)
                previous = (text, codes)
                if codes.shape[1]:
                    yield AudioChunk(self.engine.decode(codes), self.sample_rate, len(self.reports) - 1, i)


class Engine:
    def __init__(self, checkpoint: Checkpoint, config: EngineConfig):
        self.ckpt = checkpoint
        self.config = config
        self.family = checkpoint.family
        self.rules = checkpoint.family.RULES
        self.device = checkpoint.model.norm.weight.device
        self.references = ReferenceEncoder(checkpoint.codec, config.max_reference_seconds,
                                           config.reference_cache_size)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, config: EngineConfig) -> Engine:
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device, torch.bfloat16)
        codec_dtype = resolve_dtype(config.codec_dtype, device, torch.float32)
        start = time.perf_counter()
        ckpt = load_checkpoint(config.model_dir, device, dtype, codec_dtype)
        log.info("loaded %s checkpoint from %s on %s (%s, codec %s) in %.1f s", ckpt.family.NAME,
                 config.model_dir, device, dtype, codec_dtype, time.perf_counter() - start)
        return cls(ckpt, config)

    @property
    def sample_rate(self) -> int:
        return self.ckpt.codec.sample_rate

    @property
    def prompt_limit(self) -> int:
        return self.ckpt.config.max_seq_len - self.rules.prompt_reserve

    # ---- requests ---------------------------------------------------------------------------
    def start(self, request: SynthesisRequest) -> Synthesis:
        """Validates the request and encodes its references; raises InputError before any audio."""
        req = resolve(request, self.rules, self.config.max_text_length, self.config.chunk_length,
                      self.ckpt.config.max_seq_len)
        refs = self.prepare_references(req)
        texts = split_text(req.text, req.chunk_length)
        for text in texts:  # fail now, not halfway through the audio
            needed = self.build_prompt(text, refs).shape[1]
            if needed > self.prompt_limit:
                raise InputError(f"a text chunk with its references needs {needed} prompt tokens; the limit is "
                                 f"{self.prompt_limit} (use shorter or fewer references, or a smaller chunk_length)")
        return Synthesis(self, req, refs, texts)

    def stream(self, request: SynthesisRequest) -> Synthesis:
        return self.start(request)

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        synthesis = self.start(request)
        parts = [chunk.audio for chunk in synthesis]
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return SynthesisResult(audio, self.sample_rate, synthesis.seed, tuple(synthesis.reports))

    # ---- pieces -----------------------------------------------------------------------------
    def prepare_references(self, req: ResolvedRequest) -> list[tuple[str, Tensor]]:
        cfg = self.ckpt.config
        out = []
        for i, ref in enumerate(req.references):
            if ref.codes is not None:
                codes = torch.as_tensor(np.asarray(ref.codes), dtype=torch.int64)
            else:
                codes = self.references.encode(ref.audio, what=f"references[{i}].audio")
            check_codes(codes, cfg.num_codebooks, self.ckpt.tokenizer.num_semantic, cfg.codebook_size,
                        f"references[{i}]")
            out.append((ref.text, codes))
        return out

    def build_prompt(self, text: str, context: list[tuple[str, Tensor]]) -> Tensor:
        return self.family.build_prompt(self.ckpt.tokenizer, self.ckpt.config.num_codebooks, text, context,
                                        self.config.allow_special_tokens)

    def _generate_chunk(self, req: ResolvedRequest, text: str, refs: list[tuple[str, Tensor]],
                        previous: tuple[str, Tensor] | None, frame_offset: int) -> tuple[Tensor, ChunkReport, int]:
        """-> (codes int64 [n, N] on CPU, report, frames generated incl. the dropped last one)."""
        prompt = self.build_prompt(text, refs + ([previous] if previous else []))
        dropped = False
        if previous is not None and prompt.shape[1] > self.prompt_limit:
            prompt, dropped = self.build_prompt(text, refs), True
            log.info("previous chunk dropped from the context: the prompt would need %d tokens", prompt.shape[1])
        cfg = self.ckpt.config
        budget = frame_budget(prompt.shape[1], req.max_new_tokens, cfg.max_seq_len)
        params = SamplingTensors.from_values([(req.temperature, req.top_p, req.repetition_penalty, req.seed)],
                                             self.device)
        gen = Generation(raw_frames(self.ckpt.model, prompt, params, budget, self.ckpt.tokenizer.im_end_id,
                                    self.rules.penalty_window, frame_offset), self.ckpt.tokenizer.im_end_id)
        with torch.inference_mode():
            frames = list(gen)
        n = cfg.num_codebooks
        codes = torch.stack(frames, dim=1)[1:].cpu() if frames else torch.zeros(n, 0, dtype=torch.int64)
        if gen.finish_reason == "length":
            log.warning("text chunk reached max_new_tokens=%d before the model ended it", req.max_new_tokens)
        report = ChunkReport(text, codes.shape[1], gen.finish_reason or "length", dropped, prompt.shape[1])
        return codes, report, gen.generated

    def decode(self, codes: Tensor) -> np.ndarray:
        """codes: int64 [n, N] -> float32 [N * frame_length]."""
        with torch.inference_mode():
            wave = self.ckpt.codec.decode(codes[None].to(self.device))
        return wave[0, 0].float().cpu().numpy()
