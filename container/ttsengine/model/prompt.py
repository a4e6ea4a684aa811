"""Prompt tensors: a sequence of parts, each tokenised on its own, stacked into [n+1, T].

Row 0 holds token ids; rows 1..n hold codebook values at audio positions and 0 elsewhere. Which
parts go in which order is the checkpoint family's business (model/families).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """-> int64 [n+1, T]."""
    columns: list[Tensor] = []
    for part in parts:
        if isinstance(part, TextPart):
            ids = torch.tensor(tokenizer.encode(part.text, allow_special=part.allow_special), dtype=torch.int64)
            block = torch.zeros(num_codebooks + 1, ids.numel(), dtype=torch.int64)
            block[0] = ids
        else:
            codes = part.codes.to(torch.int64).cpu()
            block = torch.cat([codes[:1] + tokenizer.semantic_begin_id, codes], dim=0)
        columns.append(block)
    return torch.cat(columns, dim=1)
