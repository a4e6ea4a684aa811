"""Where a text chunk must fit, checked once per request (the one guard both engines use).

A chunk's prompt must stay within the family's prompt limit, and the prompt plus every frame the
chunk may generate within the KV positions one sequence can hold: the model's context, and for the
batched engine also its paged cache. A long text's next chunk takes the previous chunk as context
only where that still fits (Planner.chunk_prompt), so a request whose chunks fit without context
never runs out of room in the middle.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..model.generation import frame_budget


@dataclass(frozen=True)
class Capacity:
    prompt_limit: int  # tokens a prompt may hold
    max_seq_len: int  # the model's context
    kv_positions: int  # KV positions one sequence may write (<= max_seq_len for the eager engine)

    def positions(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV positions a chunk with this prompt may write: the prompt and its frame budget."""
        return prompt_len + frame_budget(prompt_len, max_new_tokens, self.max_seq_len)

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        return prompt_len <= self.prompt_limit and self.positions(prompt_len, max_new_tokens) <= self.kv_positions

    def check_references(self, frames: list[int], frame_rate: float) -> None:
        """frames: each reference's code frames (from its codes, or its audio header), one prompt token each:
        a lower bound of every chunk's prompt, checked before any reference is encoded."""
        total = sum(frames)
        if total > self.prompt_limit:
            raise InputError(f"the references need at least {total} prompt tokens ({total / frame_rate:.1f} s of "
                             f"audio); the limit is {self.prompt_limit} (use shorter or fewer references)")

    def check(self, prompt_lengths: list[int], max_new_tokens: int) -> None:
        """prompt_lengths: each text chunk's prompt without context. Raises InputError naming the limit."""
        longest = max(prompt_lengths)
        if longest > self.prompt_limit:
            raise InputError(f"a text chunk with its references needs {longest} prompt tokens; the limit is "
                             f"{self.prompt_limit} (use shorter or fewer references, or a smaller chunk_length)")
        need = max(self.positions(n, max_new_tokens) for n in prompt_lengths)
        if need > self.kv_positions:
            room = self.kv_positions - longest
            hint = (f"max_new_tokens={room} or less fits" if room > 0
                    else "use shorter or fewer references, or a smaller chunk_length")
            raise InputError(f"the request needs up to {need} KV positions; this engine's cache holds "
                             f"{self.kv_positions} ({hint})")
