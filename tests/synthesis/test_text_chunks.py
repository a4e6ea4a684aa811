from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ttsengine.synthesis.text_chunks import split_text


def test_short_text_is_one_chunk():
    assert split_text("Hello there. How are you?", 200) == ["Hello there. How are you?"]


def test_sentences_are_packed_up_to_the_limit():
    text = "One two three. Four five six! Seven eight nine? Ten eleven."
    chunks = split_text(text, 30)
    assert chunks == ["One two three. Four five six!", "Seven eight nine? Ten eleven."]


def test_decimals_and_inner_dots_do_not_split():
    assert split_text("Pi is 3.14159 and e is 2.718. Next sentence here.", 30) == [
        "Pi is 3.14159 and e is 2.718.", "Next sentence here."]


def test_cjk_terminators_and_newlines():
    assert split_text("你好。今天天气很好！我们走吧？", 8) == ["你好。", "今天天气很好！", "我们走吧？"]
    assert split_text("line one\nline two\n\nline three", 12) == ["line one", "line two", "line three"]


def test_long_sentence_splits_at_clauses_then_spaces():
    sentence = "first clause here, second clause here; third clause here: and a final part"
    chunks = split_text(sentence, 25)
    assert all(len(c) <= 25 for c in chunks)
    assert chunks[0] == "first clause here,"
    assert " ".join(chunks) == sentence


def test_word_longer_than_the_limit_is_cut():
    chunks = split_text("x" * 120, 50)
    assert chunks == ["x" * 50, "x" * 50, "x" * 20]


def test_quotes_stay_with_their_sentence():
    assert split_text('He said "stop." Then he left.', 18) == ['He said "stop."', "Then he left."]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=600), st.integers(min_value=50, max_value=300))
def test_properties(text, limit):
    chunks = split_text(text, limit)
    assert all(0 < len(c) <= limit for c in chunks)
    assert all(c == c.strip() for c in chunks)
    # nothing but whitespace is lost, and order is kept
    assert re.sub(r"\s+", "", "".join(chunks)) == re.sub(r"\s+", "", text)
