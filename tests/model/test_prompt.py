"""model/prompt.py `assemble`: the prompt's columns, part by part, as the spec lays them out (row 0 the token ids, a
codes part's semantic row offset into the token space, rows 1..n its codes, zeros under text), whatever dtype or
device the codes come in; built without torch ops (a planner beside the engine loop would wait for the GIL after
each)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine.model.prompt import CodesPart, TextPart, assemble
from ttsengine.model.tokenizer import Tokenizer

N = 4  # codebooks


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.load(MODEL_DIR)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_text_and_codes_columns(tok, dtype):
    codes = torch.arange(N * 5).reshape(N, 5).to(dtype) % 7
    a, b = tok.encode("<|speaker:0|>", allow_special=True), tok.encode("hello there", allow_special=True)
    got = assemble([TextPart("<|speaker:0|>"), CodesPart(codes), TextPart("hello there")], tok, N)
    assert got.dtype == torch.int64 and got.shape == (N + 1, len(a) + 5 + len(b))
    assert got[0].tolist() == a + (codes[0].long() + tok.semantic_begin_id).tolist() + b
    assert got[1:, len(a):len(a) + 5].equal(codes.long())
    assert not got[1:, :len(a)].any() and not got[1:, len(a) + 5:].any()


def test_special_tokens_follow_the_part(tok):
    text = "<|im_end|>"
    plain, special = assemble([TextPart(text, allow_special=False)], tok, N), assemble([TextPart(text)], tok, N)
    assert special.shape[1] == 1 and plain.shape[1] > 1  # one special id, or the characters' tokens


def test_no_parts_is_an_empty_prompt(tok):
    assert assemble([], tok, N).shape == (N + 1, 0)
