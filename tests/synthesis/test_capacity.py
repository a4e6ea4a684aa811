"""The one capacity guard, as a table: prompt limit, model context, KV cache."""

from __future__ import annotations

import pytest

from ttsengine.errors import InputError
from ttsengine.synthesis.capacity import Capacity

CAP = Capacity(prompt_limit=100, max_seq_len=300, kv_positions=200)


@pytest.mark.parametrize("prompt, max_new_tokens, positions, fits", [
    (50, 150, 200, True),
    (50, 151, 201, False),
    (50, 0, 300, False),  # 0 fills the model's context
    (100, 100, 200, True),
    (101, 10, 111, False),  # over the prompt limit, whatever the cache
    (90, 1000, 300, False),  # the frame budget stops at the model's context
])
def test_fits(prompt, max_new_tokens, positions, fits):
    assert CAP.positions(prompt, max_new_tokens) == positions
    assert CAP.fits(prompt, max_new_tokens) is fits


def test_check_passes_when_every_chunk_fits_alone():
    CAP.check([10, 100, 40], 100)


@pytest.mark.parametrize("lengths, max_new_tokens, pattern", [
    ([10, 120], 5, r"a text chunk with its references needs 120 prompt tokens; the limit is 100 \(use shorter"),
    ([10, 90], 150, r"needs up to 240 KV positions; this engine's cache holds 200 \(max_new_tokens=110 or less fits\)"),
    ([10, 90], 0, r"needs up to 300 KV positions"),
    ([100], 5, None),
])
def test_check_names_the_limit(lengths, max_new_tokens, pattern):
    if pattern is None:
        CAP.check(lengths, max_new_tokens)
        return
    with pytest.raises(InputError, match=pattern):
        CAP.check(lengths, max_new_tokens)


def test_a_cache_smaller_than_one_prompt_says_so():
    tiny = Capacity(prompt_limit=100, max_seq_len=300, kv_positions=50)
    with pytest.raises(InputError, match=r"holds 50 \(use shorter or fewer references, or a smaller chunk_length\)"):
        tiny.check([60], 1)
