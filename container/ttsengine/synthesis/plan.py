"""Turning a request into work: validate it, encode its references, split its text, build prompts.

Shared by the batched engine and the eager reference engine, so both generate from the same prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..config import EngineConfig
from ..errors import InputError
from ..model.checkpoint import Checkpoint
from ..model.generation import frame_budget
from ..model.prompt import check_codes
from .request import ResolvedRequest, SynthesisRequest, resolve
from .text_chunks import split_text
from .voice_encoder import VoiceEncoder


@dataclass(frozen=True)
class ChunkReport:
    text: str
    frames: int  # audio frames kept (the dropped last frame not counted)
    finish_reason: str  # "stop" (the model ended it) | "length" (max_new_tokens) | "cancelled"
    context_dropped: bool  # the previous chunk did not fit beside this one as context
    prompt_tokens: int


@dataclass
class Plan:
    request: ResolvedRequest
    references: list[tuple[str, Tensor]]  # (transcript, codes [n, F])
    texts: list[str]
    reports: list[ChunkReport] = field(default_factory=list)
    ignore_stop: bool = False  # benchmarks only: generate exactly max_new_tokens frames

    @property
    def seed(self) -> int:
        return self.request.seed


class Planner:
    def __init__(self, ckpt: Checkpoint, config: EngineConfig):
        self.ckpt, self.config = ckpt, config
        self.rules = ckpt.family.RULES
        self.voice_encoder = VoiceEncoder(ckpt.codec, config.max_reference_seconds, config.reference_cache_size)

    @property
    def prompt_limit(self) -> int:
        return self.ckpt.config.max_seq_len - self.rules.prompt_reserve

    def plan(self, request: SynthesisRequest) -> Plan:
        """Raises InputError before any audio: bad fields, unreadable references, a chunk that cannot fit."""
        req = resolve(request, self.rules, self.config.max_text_length, self.config.chunk_length,
                      self.ckpt.config.max_seq_len, self.config.default_max_new_tokens)
        refs = self.prepare_references(req)
        texts = split_text(req.text, req.chunk_length)
        for text in texts:
            needed = self.prompt(text, refs).shape[1]
            if needed > self.prompt_limit:
                raise InputError(f"a text chunk with its references needs {needed} prompt tokens; the limit is "
                                 f"{self.prompt_limit} (use shorter or fewer references, or a smaller chunk_length)")
        return Plan(req, refs, texts)

    def prepare_references(self, req: ResolvedRequest) -> list[tuple[str, Tensor]]:
        cfg = self.ckpt.config
        out = []
        for i, ref in enumerate(req.references):
            if ref.codes is not None:
                codes = torch.as_tensor(np.asarray(ref.codes), dtype=torch.int64)
            else:
                codes = self.voice_encoder.codes_from_bytes(ref.audio, what=f"references[{i}].audio")
            check_codes(codes, cfg.num_codebooks, self.ckpt.tokenizer.num_semantic, cfg.codebook_size,
                        f"references[{i}]")
            out.append((ref.text, codes))
        return out

    def prompt(self, text: str, context: list[tuple[str, Tensor]]) -> Tensor:
        """-> int64 [n+1, T]."""
        return self.ckpt.family.build_prompt(self.ckpt.tokenizer, self.ckpt.config.num_codebooks, text, context,
                                             self.config.allow_special_tokens)

    def chunk_prompt(self, plan: Plan, index: int, previous: tuple[str, Tensor] | None) -> tuple[Tensor, bool]:
        """Prompt of text chunk `index`: references + the previous chunk (text, codes) when it fits.
        -> (prompt [n+1, T], whether the previous chunk had to be left out)."""
        text = plan.texts[index]
        if previous is not None:
            prompt = self.prompt(text, plan.references + [previous])
            if prompt.shape[1] <= self.prompt_limit:
                return prompt, False
            return self.prompt(text, plan.references), True
        return self.prompt(text, plan.references), False

    def budget(self, prompt: Tensor, plan: Plan) -> int:
        return frame_budget(prompt.shape[1], plan.request.max_new_tokens, self.ckpt.config.max_seq_len)
