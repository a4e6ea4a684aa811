"""Splitting a long text into chunks of whole sentences.

Rules, in order:
1. Sentence ends: '.', '!', '?', '…' (runs of them, plus closing quotes/brackets) followed by
   whitespace or the end; the CJK terminators '。！？' anywhere; a line break. A '.' inside a
   token ("3.14", "e.g.x") is not an end.
2. Sentences are packed greedily, in order, into chunks of at most `max_chars` characters.
3. A sentence longer than `max_chars` is split at clause punctuation (',;:' followed by a space,
   or the CJK '，；：、'), then at spaces, and only as a last resort inside a word.
Whitespace inside a chunk is kept; chunks are stripped; empty chunks are dropped.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"""(?:[.!?…]+["'”’)\]]*(?=\s|$)|[。！？]+["'”’」』）)\]]*|\n+)""")
_CLAUSE_END = re.compile(r"""(?:[,;:](?=\s)|[，；：、])""")


def _split_after(text: str, pattern: re.Pattern[str]) -> list[str]:
    pieces, start = [], 0
    for m in pattern.finditer(text):
        pieces.append(text[start:m.end()])
        start = m.end()
    pieces.append(text[start:])
    return [p for p in pieces if p.strip()]


def _pack(pieces: list[str], max_chars: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + len(piece) > max_chars:
            chunks.append(current)
            current = ""
        current += piece
    if current:
        chunks.append(current)
    return chunks


def _split_long(sentence: str, max_chars: int) -> list[str]:
    if len(sentence) <= max_chars:
        return [sentence]
    for pattern in (_CLAUSE_END, re.compile(r"\s+")):
        pieces = _split_after(sentence, pattern)
        if len(pieces) > 1:
            return [c for p in _pack(pieces, max_chars) for c in _split_long(p, max_chars)]
    return [sentence[i:i + max_chars] for i in range(0, len(sentence), max_chars)]


def split_text(text: str, max_chars: int) -> list[str]:
    pieces = [p for s in _split_after(text, _SENTENCE_END) for p in _split_long(s, max_chars)]
    return [c.strip() for c in _pack(pieces, max_chars) if c.strip()]
