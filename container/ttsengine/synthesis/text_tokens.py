"""The tokenized text parts of one request, each encoded once.

A request's prompts share most of their parts: the speaker tags, every reference transcript, and each
text chunk, which is tokenized for its own prompt and again as the context of the next chunk's. The
family's prompt builder reads the tokenizer through `encode` and `semantic_begin_id` only, so it gets
this memo in the tokenizer's place and the prompts stay exactly what the tokenizer makes.
"""

from __future__ import annotations

from ..model.tokenizer import Tokenizer


class TextTokens:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.semantic_begin_id = tokenizer.semantic_begin_id
        self._ids: dict[tuple[str, bool], list[int]] = {}

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """The tokenizer's ids for `text`; the list is shared, callers do not change it."""
        key = (text, allow_special)
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = self.tokenizer.encode(text, allow_special=allow_special)
        return ids
