"""Prompt tensors: a sequence of parts, each tokenised on its own, stacked into [n+1, T].

Row 0 holds token ids; rows 1..n hold codebook values at audio positions and 0 elsewhere. Which
parts go in which order is the checkpoint family's business (model/families).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class TextPart:
    text: str
    allow_special: bool = True  # recognise <|...|> inside this text


@dataclass(frozen=True)
class CodesPart:
    codes: Tensor  # int64 [n, F]: row 0 semantic index, rows 1..n-1 residual codes


def check_codes(codes: Tensor, num_codebooks: int, num_semantic: int, codebook_size: int, what: str) -> None:
    if codes.dim() != 2 or codes.shape[0] != num_codebooks:
        raise InputError(f"{what}: codes must have shape [{num_codebooks}, frames], got {list(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes[0].max()) >= num_semantic
                          or int(codes.max()) >= codebook_size):
        raise InputError(f"{what}: code values out of range (semantic < {num_semantic}, others < {codebook_size})")


def assemble(parts: list[TextPart | CodesPart], tokenizer: Tokenizer, num_codebooks: int) -> Tensor:
    """-> int64 [n+1, T]. Built in NumPy and handed to torch once: a request is planned on a thread beside the engine
    loop, and each torch op releases the GIL, which the planner then waits to get back (up to the switch interval,
    5 ms, while the loop runs Python); the dozen small ops a prompt took made a burst's planning slow in the engine
    process. Same values as stacking the parts' torch blocks."""
    blocks: list[tuple[list[int] | None, np.ndarray | None]] = []
    width = 0
    for part in parts:
        if isinstance(part, TextPart):
            ids = tokenizer.encode(part.text, allow_special=part.allow_special)
            blocks.append((ids, None))
            width += len(ids)
        else:
            codes = part.codes
            codes = (codes if codes.dtype == torch.int64 and codes.device.type == "cpu" else
                     codes.to(torch.int64).cpu()).numpy()
            blocks.append((None, codes))
            width += codes.shape[1]
    out = np.zeros((num_codebooks + 1, width), dtype=np.int64)
    at = 0
    for ids, codes in blocks:
        if codes is None:
            out[0, at:at + len(ids)] = ids
            at += len(ids)
        else:
            n = codes.shape[1]
            out[0, at:at + n] = codes[0] + tokenizer.semantic_begin_id
            out[1:, at:at + n] = codes
            at += n
    return torch.from_numpy(out)
