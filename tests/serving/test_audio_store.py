"""Files kept for download links: named before they are written, served only when finished, bounded in time
and in total size; a streamed WAV gets its real sizes. Real files in a temporary directory."""

from __future__ import annotations

import io
import os
import struct
import time

import numpy as np
import soundfile as sf

from ttsengine import AudioEncoder
from ttsengine.serving.audio_store import AudioStore


def test_a_file_is_served_only_when_finished(tmp_path):
    store = AudioStore(tmp_path / "dl", ttl=60, max_bytes=1 << 20)
    pending = store.start("mp3")
    assert pending.name.endswith(".mp3") and len(pending.name) == 32 + 4
    pending.write(b"abc")
    assert store.path(pending.name) is None  # still being written
    pending.write(b"def")
    pending.finish()
    assert store.path(pending.name).read_bytes() == b"abcdef"
    assert store.start("mp3").name != pending.name


def test_discarded_files_leave_nothing(tmp_path):
    store = AudioStore(tmp_path, ttl=60, max_bytes=1 << 20)
    pending = store.start("wav")
    pending.write(b"half")
    pending.discard()
    assert store.path(pending.name) is None and list(tmp_path.iterdir()) == []


def test_names_that_are_not_ours_are_never_paths(tmp_path):
    store = AudioStore(tmp_path / "dl", ttl=60, max_bytes=1 << 20)
    (tmp_path / "secret.wav").write_bytes(b"x")
    for name in ("../secret.wav", "secret.wav", "a" * 32 + ".exe", "A" * 32 + ".wav", "", "." * 36):
        assert store.path(name) is None, name


def test_files_expire(tmp_path):
    store = AudioStore(tmp_path, ttl=30, max_bytes=1 << 20)
    old, new = store.start("pcm"), store.start("pcm")
    for p in (old, new):
        p.write(b"x" * 10)
        p.finish()
    stale = time.time() - 31
    os.utime(tmp_path / old.name, (stale, stale))  # as if written 31 s ago (or by an earlier run)
    leftover = tmp_path / ("b" * 32 + ".wav.part")  # an earlier run died mid-file
    leftover.write_bytes(b"x")
    os.utime(leftover, (stale, stale))
    assert store.path(old.name) is None and store.path(new.name) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.name]


def test_the_total_size_is_bounded_oldest_first(tmp_path):
    store = AudioStore(tmp_path, ttl=3600, max_bytes=250)
    names = []
    for i in range(4):
        p = store.start("pcm")
        p.write(b"x" * 100)
        t = time.time() - 100 + i  # distinct ages, oldest first
        p.finish()
        os.utime(tmp_path / p.name, (t, t))
        names.append(p.name)
    store.sweep()
    assert [store.path(n) is not None for n in names] == [False, False, True, True]
    big = store.start("pcm")
    big.write(b"x" * 300)  # alone over the bound: not kept, and nothing else is lost for it
    big.finish()
    assert store.path(big.name) is None and store.path(names[3]) is not None


def test_a_streamed_wav_is_kept_with_its_real_sizes(tmp_path):
    audio = (0.3 * np.sin(np.arange(44100 // 2) / 20)).astype(np.float32)
    enc = AudioEncoder("wav", 44100, streaming=True)
    chunks = [enc.encode(audio[:10000]), enc.encode(audio[10000:]), enc.finish()]
    assert struct.unpack("<I", chunks[0][40:44])[0] == 0xFFFFFFFF  # what went over the wire
    store = AudioStore(tmp_path, ttl=60, max_bytes=1 << 20)
    pending = store.start("wav")
    for c in chunks:
        pending.write(c)
    pending.finish()
    data = store.path(pending.name).read_bytes()
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8 and struct.unpack("<I", data[40:44])[0] == len(data) - 44
    info = sf.info(io.BytesIO(data))
    assert info.frames == len(audio) and info.samplerate == 44100
    assert data[44:] == b"".join(chunks)[44:]  # the samples as streamed


def test_an_unusable_directory_falls_back_to_a_temporary_one(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = AudioStore(blocker / "downloads", ttl=60, max_bytes=1 << 20)
    assert store.root.is_dir() and not str(store.root).startswith(str(blocker))
    p = store.start("mp3")
    p.write(b"ok")
    p.finish()
    assert store.path(p.name).read_bytes() == b"ok"
