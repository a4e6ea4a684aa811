from __future__ import annotations

import json

import pytest
from conftest import GOLDEN, MODEL_DIR

from ttsengine.errors import CheckpointError
from ttsengine.model.tokenizer import Tokenizer, read_special_tokens, read_tiktoken_ranks


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.load(MODEL_DIR)


@pytest.mark.parametrize("text", [
    "Hello world!", "", " ", "  leading and trailing  ", "tabs\tand\nnewlines\r\n\n", "café 世界 123",
    "emoji 🎉🚀 mixed", "it's we'll they'd", "<|im_end|>inline<|speaker:0|>", "a" * 1000, "?!?!", "\u0000\u00ff",
])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_golden_cases(tok):
    meta = json.loads((GOLDEN / "meta.json").read_text())
    for case in meta["tokenizer"]["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]


def test_ids_of_the_tiny_vocab(tok):
    assert tok.n_vocab == 347
    assert (tok.semantic_begin_id, tok.semantic_end_id, tok.num_semantic) == (315, 346, 32)
    assert tok.im_end_id == 304 and tok.interleave_id == 311
    assert tok.encode("<|semantic:3|>") == [318]


def test_specials_can_be_disabled(tok):
    assert tok.encode("<|im_end|>") == [304]
    plain = tok.encode("<|im_end|>", allow_special=False)
    assert 304 not in plain and tok.decode(plain) == "<|im_end|>"


def test_whitespace_quirk_keeps_space_run_apart(tok):
    # upstream's escaped '?!' branch: "  b" pre-tokenises as "  " then "b", not " " + " b"
    ids = tok.encode("  spaces")
    assert ids[:2] == [32, 32]


def test_long_text_is_encoded_in_slices(tok):
    text = "word " * 100_001  # > 400k chars
    ids = tok.encode(text)
    assert tok.decode(ids) == text


def test_bad_tokenizer_files(tmp_path):
    bad = tmp_path / "tokenizer.tiktoken"
    bad.write_text("not-base64!! 0\n")
    with pytest.raises(CheckpointError, match=r"tokenizer.tiktoken:1: invalid entry"):
        read_tiktoken_ranks(bad)
    bad.write_text("QQ== 0\n")
    with pytest.raises(CheckpointError, match="needs all 256 bytes"):
        read_tiktoken_ranks(bad)
    with pytest.raises(CheckpointError, match="file not found"):
        read_tiktoken_ranks(tmp_path / "missing.tiktoken")
    st = tmp_path / "special_tokens.json"
    st.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        read_special_tokens(st)
    st.write_text("{oops")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_special_tokens(st)


def test_semantic_tokens_must_be_contiguous():
    ranks = {bytes([i]): i for i in range(256)}
    with pytest.raises(CheckpointError, match="not contiguous"):
        Tokenizer(ranks, ["<|im_end|>", "<|interleave|>", "<|semantic:0|>", "<|pad|>", "<|semantic:1|>"])
    with pytest.raises(CheckpointError, match="no <|semantic:N|>"):
        Tokenizer(ranks, ["<|im_end|>", "<|interleave|>"])
    with pytest.raises(CheckpointError, match="<|im_end|> is missing"):
        Tokenizer(ranks, ["<|interleave|>", "<|semantic:0|>"])


@pytest.mark.parametrize("text", [
    "Hello world!", "", "<|im_end|>", "<|speaker:0|>", "<|interleave|>", "x<|im_end|>y<|semantic:3|>z",
    "< | not special |>", "<|", "|>", "a <|semantic:31|> b", "<|im_end|" + "x" * 70, "<" * 80, "é<|im_end|>é",
])
def test_shortcuts_give_the_plain_encoding(tok, text):
    # encode skips tiktoken's allowed-set conversion where no special token can occur and memoises short texts
    # that may hold one: both must give the ids of the unshortened call, every time (the memo's copies too)
    direct = tok._enc.encode(text, allowed_special="all", disallowed_special=())
    for _ in range(2):
        ids = tok.encode(text)
        assert ids == direct
        ids.append(-1)  # a caller changing its list does not change the memo's
    assert tok.encode(text, allow_special=False) == tok._enc.encode(text, allowed_special=set(),
                                                                    disallowed_special=())


def test_the_memo_stays_bounded(tok, monkeypatch):
    monkeypatch.setattr("ttsengine.model.tokenizer.MEMO_ENTRIES", 3)
    tok._memo.clear()
    for i in range(10):
        assert tok.encode(f"<|im_end|>{i}") == [304] + tok.encode(str(i))
        assert len(tok._memo) <= 3
