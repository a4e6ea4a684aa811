"""Byte-level BPE tokenizer from `tokenizer.tiktoken` + `special_tokens.json` (S1 spec §4)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path

import tiktoken

from ..errors import CheckpointError

# Upstream's pre-tokeniser. The 7th branch escapes its '?', so it literally needs the characters
# '?!' instead of being a look-ahead: a run of spaces before a word becomes its own piece.
PRETOKENIZE_PATTERN = "|".join((
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
    r"\p{P}",
    r"[^\r\n\p{L}\p{N}]?\p{L}+",
    r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(\?!\S)",
    r"\s+",
))
MAX_ENCODE_CHARS = 400_000  # upstream encodes longer texts in independent slices of this size
MEMO_CHARS, MEMO_ENTRIES = 64, 4096  # Tokenizer.encode keeps the ids of short texts with special tokens
IM_END = "<|im_end|>"
INTERLEAVE = "<|interleave|>"
_SEMANTIC = re.compile(r"<\|semantic:(\d+)\|>")


class Tokenizer:
    def __init__(self, ranks: dict[bytes, int], special_tokens: list[str], name: str = "s1"):
        # Upstream ignores the ids stored in special_tokens.json: id = len(ranks) + file order.
        self.specials = {tok: len(ranks) + i for i, tok in enumerate(special_tokens)}
        self._enc = tiktoken.Encoding(name=name, pat_str=PRETOKENIZE_PATTERN, mergeable_ranks=ranks,
                                      special_tokens=self.specials)
        self.n_vocab = len(ranks) + len(special_tokens)
        # every special token's first two characters: a text holding none of them holds no special token, and
        # its encoding with every special allowed is the ordinary one. Worth knowing because tiktoken converts
        # the allowed set (4,100+ strings with the semantic tokens) on every call: ~0.3 ms, per prompt part
        self._special_heads = frozenset(t[:2] for t in self.specials)
        self._memo: dict[str, list[int]] = {}  # short texts with a possible special token, all allowed
        semantic = sorted((int(m.group(1)), i) for t, i in self.specials.items() if (m := _SEMANTIC.fullmatch(t)))
        if not semantic:
            raise CheckpointError(f"{name}: special tokens hold no <|semantic:N|> entries")
        begin = semantic[0][1]
        if any(k != j or i != begin + j for j, (k, i) in enumerate(semantic)):
            raise CheckpointError(f"{name}: <|semantic:N|> tokens are not contiguous from <|semantic:0|>")
        self.semantic_begin_id, self.semantic_end_id = begin, semantic[-1][1]
        for required in (IM_END, INTERLEAVE):
            if required not in self.specials:
                raise CheckpointError(f"{name}: special token {required} is missing")
        self.im_end_id = self.specials[IM_END]
        self.interleave_id = self.specials[INTERLEAVE]

    @property
    def num_semantic(self) -> int:
        return self.semantic_end_id - self.semantic_begin_id + 1

    @classmethod
    def load(cls, model_dir: Path) -> Tokenizer:
        model_dir = Path(model_dir)
        ranks = read_tiktoken_ranks(model_dir / "tokenizer.tiktoken")
        specials = read_special_tokens(model_dir / "special_tokens.json")
        return cls(ranks, specials, name=str(model_dir))

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """allow_special: recognise `<|...|>` special tokens inside the text (upstream does);
        False encodes them as plain characters."""
        if allow_special and not any(h in text for h in self._special_heads):
            allow_special = False  # nothing special to recognise: the same ids, without the set's conversion
        if allow_special and len(text) <= MEMO_CHARS:  # prompt tags ("<|speaker:0|>") recur in every request
            ids = self._memo.get(text)
            if ids is None:
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                ids = self._memo[text] = self._encode(text, "all")
            return list(ids)
        return self._encode(text, "all" if allow_special else set())

    def _encode(self, text: str, allowed) -> list[int]:
        out: list[int] = []
        for i in range(0, len(text), MAX_ENCODE_CHARS):
            out += self._enc.encode(text[i:i + MAX_ENCODE_CHARS], allowed_special=allowed, disallowed_special=())
        return out

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text") from None
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise CheckpointError(f"{path}:{lineno}: expected 'base64 rank', got {line[:60]!r}")
        if parts[0] == "=":  # the empty byte string: upstream skips it
            continue
        try:
            ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
        except (binascii.Error, ValueError):
            raise CheckpointError(f"{path}:{lineno}: invalid entry {line[:60]!r}") from None
    if len(ranks) < 256:
        raise CheckpointError(f"{path}: only {len(ranks)} ranks; a byte-level BPE needs all 256 bytes")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise CheckpointError(f"{path}: ranks are not dense 0..{len(ranks) - 1}")
    return ranks


def read_special_tokens(path: Path) -> list[str]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise CheckpointError(f"{path}: expected a JSON object mapping token -> id")
    return list(data)  # file order decides the ids
