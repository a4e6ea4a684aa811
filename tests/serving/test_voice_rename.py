"""Renaming a stored voice (fish-speech's /v1/references/update) and replacing one: real files, a stand-in
encoder (the codes are the audio's length)."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine import InputError
from ttsengine.serving.voices import VoiceExists, VoiceStore


def encode(audio: bytes) -> np.ndarray:
    return np.full((4, len(audio)), 7, np.int64)


@pytest.fixture
def store(tmp_path) -> VoiceStore:
    s = VoiceStore(tmp_path, encode, "test", 21.5)
    s.add("alice", b"aaaa", "hello alice")
    s.add("bob", b"bb", "hello bob")
    return s


def test_rename(store):
    assert store.rename("alice", "Alice 2") is True
    assert store.ids() == ["Alice 2", "bob"] and store.get("alice") is None
    voice = store.get("Alice 2")
    assert voice.text == "hello alice" and voice.codes.shape == (4, 4)


def test_rename_refusals(store):
    assert store.rename("nobody", "carol") is False
    with pytest.raises(VoiceExists, match="voice 'bob' already exists") as e:
        store.rename("alice", "bob")
    assert e.value.status == 409
    with pytest.raises(InputError, match="the new voice id is the old one"):
        store.rename("alice", "alice")
    with pytest.raises(InputError, match="invalid voice id"):
        store.rename("alice", "../escape")
    assert store.ids() == ["alice", "bob"]


def test_replace_keeps_the_id_with_new_audio_and_text(store):
    store.add("alice", b"a" * 9, "new words", replace=True)
    voice = store.get("alice")
    assert voice.text == "new words" and voice.codes.shape == (4, 9)
    with pytest.raises(VoiceExists):
        store.add("alice", b"x", "no replace")


def test_a_transcript_no_clip_could_have_is_refused_before_encoding(tmp_path):
    encoded = []
    s = VoiceStore(tmp_path, lambda audio: encoded.append(audio) or encode(audio), "test", 21.5)
    with pytest.raises(InputError, match="the transcript has 1000000 characters; a reference's is at most 5000"):
        s.add("long", b"aaaa", "x" * 1_000_000)
    assert encoded == [] and s.ids() == []
    assert s.add("fine", b"aaaa", "y" * 5000).text == "y" * 5000


def test_deleting_or_replacing_a_voice_tells_who_cached_its_prompt(store):
    # the engines drop the voice's cached prompt prefix (engine/control/prefix_cache.py); a rename changes no prompt
    told = []
    store.forget = lambda text, codes: told.append((text, codes.shape))
    store.rename("bob", "robert")
    assert told == []
    store.add("alice", b"aaaaaa", "new words", replace=True)
    assert told == [("hello alice", (4, 4))]  # the old voice's transcript and codes
    assert store.delete("robert") and told[-1] == ("hello bob", (4, 2))
    store.forget = lambda text, codes: 1 / 0  # a failing listener never fails the store's own work
    assert store.delete("alice") and store.ids() == []


@pytest.mark.parametrize("meanwhile", [
    lambda s: s.delete("alice"),
    lambda s: s.rename("alice", "carol"),
    lambda s: (s.delete("alice"), s.add("alice", b"zz", "a new alice")),  # another voice under the same id
])
def test_a_replace_loses_to_a_delete_or_rename_committed_while_it_encoded(tmp_path, meanwhile):
    from ttsengine.serving.voices import VoiceNotFound

    during = []

    def encode_then(audio: bytes) -> np.ndarray:
        if during:
            during.pop()(store)  # another request commits while this one encodes
        return encode(audio)

    store = VoiceStore(tmp_path, encode_then, "test", 21.5)
    store.add("alice", b"aaaa", "hello alice")
    during.append(meanwhile)
    with pytest.raises(VoiceNotFound, match="deleted or renamed while"):
        store.replace("alice", b"new audio", "new words")
    after = store.ids()
    assert len(after) <= 1 and all(store.get(v).text != "new words" for v in after)  # never two, never revived


def test_of_two_replaces_the_later_to_commit_wins(tmp_path):
    during = []

    def encode_then(audio: bytes) -> np.ndarray:
        if during:
            during.pop()(store)
        return encode(audio)

    store = VoiceStore(tmp_path, encode_then, "test", 21.5)
    store.add("alice", b"aaaa", "hello alice")
    during.append(lambda s: s.replace("alice", b"first", "first words"))
    store.replace("alice", b"second!", "second words")  # started first, commits last
    assert store.get("alice").text == "second words" and store.ids() == ["alice"]
