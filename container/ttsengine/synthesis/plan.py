"""Turning a request into work: validate it, encode its references, split its text, build prompts.

Cheap checks come first: the references' lengths from their headers against the prompt limit before any
reference is decoded or encoded.

Shared by the batched engine and the eager engine, so both generate from the same prompts. Each text
part is tokenized once per request (the Plan keeps the ids) and every request passes one capacity
guard (capacity.py) before any audio.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..config import EngineConfig
from ..errors import Abandoned, InputError
from ..model.generation import frame_budget
from ..model.loading.checkpoint import Checkpoint
from ..model.prompt import check_codes
from .capacity import Capacity
from .request import ResolvedRequest, SynthesisRequest, resolve
from .text_chunks import split_text
from .text_tokens import TextTokens
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
    tokens: TextTokens  # every text part of this request's prompts, tokenized once
    prompt_lengths: list[int]  # each text chunk's prompt without the previous chunk as context
    reports: list[ChunkReport] = field(default_factory=list)
    ignore_stop: bool = False  # benchmarks only: generate exactly max_new_tokens frames
    keep_codes: bool = False  # checks only (bench --check-audio): each text chunk's kept codes land in `codes`
    admitted: bool = False  # SynthesisRequest.admitted: goodput admission lets it in
    slack_s: float = 0.0  # SynthesisRequest.slack_s
    codes: list[np.ndarray] = field(default_factory=list)  # int64 [num_codebooks, kept frames] per text chunk
    # the first columns every chunk's prompt shares with other requests using the same references (the
    # references' turns: everything before the previous chunk and the text); the engine caches their KV
    prefix_length: int = 0

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def frames(self) -> int:
        """Kept frames of the text chunks reported so far (0 when done: the generation made no audio)."""
        return sum(r.frames for r in self.reports)


class Planner:
    def __init__(self, ckpt: Checkpoint, config: EngineConfig, kv_positions: int | None = None,
                 encode_lock: threading.Lock | None = None):
        """kv_positions: what one sequence may hold in the engine's KV cache (None: the model's context);
        encode_lock: held while a reference runs through the codec's encoder (see VoiceEncoder)."""
        self.ckpt, self.config = ckpt, config
        self.rules = ckpt.family.RULES
        self.voice_encoder = VoiceEncoder(ckpt.codec, config.max_reference_seconds, config.reference_cache_size,
                                          encode_lock)
        max_seq_len = ckpt.config.max_seq_len
        self.capacity = Capacity(max_seq_len - self.rules.prompt_reserve, max_seq_len,
                                 min(kv_positions or max_seq_len, max_seq_len))

    @property
    def prompt_limit(self) -> int:
        return self.capacity.prompt_limit

    @property
    def frame_rate(self) -> float:
        """Code frames per second of audio (21.53 for S1)."""
        return self.ckpt.codec.sample_rate / self.ckpt.codec.frame_length

    @property
    def codec_tag(self) -> str:
        """Identifies the codec that stored voice codes were made with."""
        from ..model.loading.weights import fingerprint

        return fingerprint(self.ckpt.codec)

    def voice_codes(self, audio: bytes) -> np.ndarray:
        """Reference audio (any soundfile-readable bytes) -> codes int64 [n, F]; InputError if unreadable."""
        return self.voice_encoder.codes_from_bytes(audio).numpy()

    def plan(self, request: SynthesisRequest | Plan, abandoned: Callable[[], bool] | None = None) -> Plan:
        """Raises InputError before any audio: bad fields, unreadable references, a chunk that cannot fit.
        A Plan made elsewhere (e.g. by an engine with a larger cache) is checked against this capacity.
        abandoned: True once nobody waits for the answer (the client left): checked before each reference is
        measured or encoded, which stops there with Abandoned."""
        if isinstance(request, Plan):
            self.capacity.check(request.prompt_lengths, request.request.max_new_tokens)
            return request
        req = resolve(request, self.rules, self.config.max_text_length, self.config.chunk_length,
                      self.ckpt.config.max_seq_len, self.config.default_max_new_tokens)
        self.check_reference_lengths(req, abandoned)  # headers first: before any reference is decoded or encoded
        refs = self.prepare_references(req, abandoned)
        texts = split_text(req.text, req.chunk_length)
        tokens = TextTokens(self.ckpt.tokenizer)
        lengths = [self.prompt(text, refs, tokens).shape[1] for text in texts]
        self.capacity.check(lengths, req.max_new_tokens)
        return Plan(req, refs, texts, tokens, lengths, prefix_length=self.prefix(refs, tokens).shape[1],
                    keep_codes=request.keep_codes, admitted=request.admitted, slack_s=max(0.0, request.slack_s))

    def check_reference_lengths(self, req: ResolvedRequest, abandoned: Callable[[], bool] | None = None) -> None:
        """The cheap checks, before any encode: at most max_references references, every reference's header
        readable, its rate in range and its length within the limit, and their code frames together (each is one
        prompt token; 21.5 per second of S1 audio) within the prompt limit. A length the header does not give is
        measured by decoding without keeping samples, and only as far as the room the others left."""
        refs = req.references
        if len(refs) > self.config.max_references:
            raise InputError(f"{len(refs)} references; the limit is {self.config.max_references} (TTS_MAX_REFERENCES)")
        frames, unknown = [], []
        for i, ref in enumerate(refs):
            if ref.codes is not None:
                shape = np.shape(ref.codes)
                frames.append(int(shape[-1]) if len(shape) == 2 else 0)  # check_codes names a bad shape
            else:
                n = self.voice_encoder.header_frames(ref.audio, what=f"references[{i}].audio")
                frames.append(n or 0)
                if n is None:
                    unknown.append(i)
        rate = self.ckpt.codec.sample_rate / self.ckpt.codec.frame_length
        self.capacity.check_references(frames, rate)
        for i in unknown:  # the lengths no header gave, measured within the room the others left
            Abandoned.check(abandoned)
            room = self.capacity.prompt_limit - sum(frames)
            frames[i] = self.voice_encoder.measured_frames(refs[i].audio, room, what=f"references[{i}].audio")
            self.capacity.check_references(frames, rate)

    def prepare_references(self, req: ResolvedRequest,
                           abandoned: Callable[[], bool] | None = None) -> list[tuple[str, Tensor]]:
        cfg = self.ckpt.config
        out = []
        for i, ref in enumerate(req.references):
            if ref.codes is not None:
                codes = torch.as_tensor(np.asarray(ref.codes), dtype=torch.int64)
            else:
                codes = self.voice_encoder.codes_from_bytes(ref.audio, what=f"references[{i}].audio",
                                                            abandoned=abandoned)
            check_codes(codes, cfg.num_codebooks, self.ckpt.tokenizer.num_semantic, cfg.codebook_size,
                        f"references[{i}]")
            out.append((ref.text, codes))
        return out

    def prompt(self, text: str, context: list[tuple[str, Tensor]], tokens: TextTokens | None = None) -> Tensor:
        """tokens: a request's memo of tokenized parts (None: tokenize afresh). -> int64 [n+1, T]."""
        tokenizer = self.ckpt.tokenizer if tokens is None else tokens
        return self.ckpt.family.build_prompt(tokenizer, self.ckpt.config.num_codebooks, text, context,
                                             self.config.allow_special_tokens)

    def prefix(self, references: list[tuple[str, Tensor]], tokens: TextTokens | None = None) -> Tensor:
        """The columns every prompt with these references starts with, whatever its text -> int64 [n+1, P]."""
        tokenizer = self.ckpt.tokenizer if tokens is None else tokens
        return self.ckpt.family.build_prefix(tokenizer, self.ckpt.config.num_codebooks, references,
                                             self.config.allow_special_tokens)

    def chunk_prompt(self, plan: Plan, index: int, previous: tuple[str, Tensor] | None) -> tuple[Tensor, bool]:
        """Prompt of text chunk `index`: references + the previous chunk (text, codes) where it fits (the
        capacity guard passed the chunk without it). -> (prompt [n+1, T], whether the previous chunk was left out)."""
        text = plan.texts[index]
        if previous is not None:
            prompt = self.prompt(text, plan.references + [previous], plan.tokens)
            if self.capacity.fits(prompt.shape[1], plan.request.max_new_tokens):
                return prompt, False
            return self.prompt(text, plan.references, plan.tokens), True
        return self.prompt(text, plan.references, plan.tokens), False

    def budget(self, prompt: Tensor, plan: Plan) -> int:
        return frame_budget(prompt.shape[1], plan.request.max_new_tokens, self.ckpt.config.max_seq_len)
