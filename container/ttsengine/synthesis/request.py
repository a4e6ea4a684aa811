"""A synthesis request as the engine takes it, and its validation into concrete parameters.

Adapters build a SynthesisRequest from their wire format (ttsengine.serving.protocol); the engine resolves
it here, once, before any work starts, so a bad request fails fast with one clear line.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class Reference:
    """A voice to clone: the transcript plus either audio bytes (any format soundfile reads) or
    codes already encoded by this codec (int [n, F], e.g. a stored voice)."""

    text: str
    audio: bytes | None = None
    codes: np.ndarray | None = None


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    references: tuple[Reference, ...] = ()
    seed: int | None = None  # None: a random seed, reported back so the result can be reproduced
    temperature: float | None = None  # None: the checkpoint family's default
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None  # frames per text chunk; 0 = as many as the context allows
    chunk_length: int | None = None  # characters per text chunk; None: the engine's setting
    keep_codes: bool = False  # each text chunk's kept codes stay on the plan (a live session's next context, checks)
    admitted: bool = False  # the follow-up of a stream already admitted (a live session's next segment): goodput
    # admission does not refuse it, so a conversation under way is never cut off mid-turn (the slots still decide)
    slack_s: float = 0.0  # seconds its first audio may come later without a listener waiting for it (a live
    # session's next segment while the one before still plays): with the feature segment_slack the engine starts
    # it behind requests queued after it whose deadline (queued + slack) is earlier


@dataclass(frozen=True)
class ResolvedRequest:
    text: str
    references: tuple[Reference, ...]
    seed: int
    temperature: float
    top_p: float
    repetition_penalty: float
    max_new_tokens: int
    chunk_length: int


def _number(name: str, value: object, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise InputError(f"{name}={value} is outside the allowed range [{lo}, {hi}]")
    return float(value)


def resolve(req: SynthesisRequest, rules, max_text_length: int, default_chunk_length: int,
            max_seq_len: int, default_max_new_tokens: int = 0) -> ResolvedRequest:
    """rules: the checkpoint family's GenerationRules (ranges and defaults)."""
    if not isinstance(req.text, str):
        raise InputError("text must be a string")
    text = req.text.strip()
    if not text:
        raise InputError("text is empty")
    if len(text) > max_text_length:
        raise InputError(f"text has {len(text)} characters; the limit is {max_text_length}")

    def pick(name: str, value, default, lo_hi) -> float:
        return _number(name, default if value is None else value, *lo_hi)

    temperature = pick("temperature", req.temperature, rules.default_temperature, rules.temperature_range)
    top_p = pick("top_p", req.top_p, rules.default_top_p, rules.top_p_range)
    penalty = pick("repetition_penalty", req.repetition_penalty, rules.default_repetition_penalty,
                   rules.repetition_penalty_range)
    mnt = (default_max_new_tokens or rules.default_max_new_tokens) if req.max_new_tokens is None else req.max_new_tokens
    if isinstance(mnt, bool) or not isinstance(mnt, int) or not 0 <= mnt <= max_seq_len:
        raise InputError(f"max_new_tokens must be an integer in [0, {max_seq_len}], got {mnt!r}")
    chunk = default_chunk_length if req.chunk_length is None else req.chunk_length
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 50 <= chunk <= 1000:
        raise InputError(f"chunk_length must be an integer in [50, 1000], got {chunk!r}")
    seed = req.seed
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX:
        raise InputError(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {seed!r}")
    for i, ref in enumerate(req.references):
        if not isinstance(ref.text, str):
            raise InputError(f"references[{i}].text must be a string")
        if (ref.audio is None) == (ref.codes is None):
            raise InputError(f"references[{i}] needs exactly one of audio or codes")
        if ref.audio is not None and not ref.audio:
            raise InputError(f"references[{i}].audio is empty")
    return ResolvedRequest(text=text, references=tuple(req.references), seed=seed, temperature=temperature,
                           top_p=top_p, repetition_penalty=penalty, max_new_tokens=mnt, chunk_length=chunk)
