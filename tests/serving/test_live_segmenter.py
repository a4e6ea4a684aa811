"""Where live text is cut into segments (serving/live/segmenter.py)."""

from __future__ import annotations

from ttsengine.serving.live.segmenter import Segmenter


def test_a_sentence_end_cuts_once_the_next_piece_shows_white_space():
    s = Segmenter(200)
    assert s.feed("Hello there.") == []  # "3.5" may follow: wait
    assert s.feed(" How") == ["Hello there."]
    assert s.feed(" are you? Fine") == ["How are you?"]
    assert s.feed("!\n") == ["Fine!"]
    assert s.pending == ""


def test_numbers_and_cjk_and_line_breaks():
    s = Segmenter(200)
    assert s.feed("It is 3") == [] and s.feed(".5 now. ") == ["It is 3.5 now."]
    assert s.feed("你好。今天") == ["你好。"]
    assert s.feed("好\nNext") == ["今天好"]
    assert s.flush() == ["Next"] and s.flush() == []


def test_the_cap_cuts_at_the_last_space_or_comma_else_hard():
    s = Segmenter(20)
    assert s.feed("one two three four five six") == ["one two three four"]
    assert s.pending == "five six"
    assert Segmenter(5).feed("abcdefghijk") == ["abcde", "fghij"]
    assert Segmenter(12).feed("alpha, beta gamma delta") == ["alpha, beta"]


def test_flush_returns_the_rest_and_empty_segments_are_dropped():
    s = Segmenter(200)
    assert s.feed("   ") == [] and s.flush() == []
    assert s.feed("Done.  ") == ["Done."] and s.flush() == []
