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


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_files_expire(tmp_path):
    clock = Clock()
    store = AudioStore(tmp_path, ttl=30, max_bytes=1 << 20, clock=clock)
    old = store.start("pcm")
    old.write(b"x" * 10)
    old.finish()
    clock.now += 20
    new = store.start("pcm")
    new.write(b"x" * 10)
    new.finish()
    clock.now += 11  # old: 31 s, new: 11 s
    assert store.path(old.name) is None and store.path(new.name) is not None
    store.sweep()
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.name]


def test_an_earlier_runs_files_are_indexed_once_and_its_leftovers_deleted(tmp_path):
    kept, stale = "a" * 32 + ".mp3", "c" * 32 + ".mp3"
    (tmp_path / kept).write_bytes(b"x" * 10)
    (tmp_path / stale).write_bytes(b"x" * 10)
    os.utime(tmp_path / stale, (time.time() - 31, time.time() - 31))
    (tmp_path / ("b" * 32 + ".wav.part")).write_bytes(b"x")  # an earlier run died mid-file
    (tmp_path / "notes.txt").write_text("not ours")  # left alone, never served
    store = AudioStore(tmp_path, ttl=30, max_bytes=1 << 20)
    assert store.path(kept) is not None and store.path(stale) is None and store.count() == (1, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept, "notes.txt"]
    fresh = tmp_path / ("d" * 32 + ".mp3")  # written behind the store's back: lookups never read the directory
    fresh.write_bytes(b"x")
    assert store.path(fresh.name) is None


def test_the_total_size_is_bounded_oldest_first(tmp_path):
    clock = Clock()
    store = AudioStore(tmp_path, ttl=3600, max_bytes=250, clock=clock)
    names = []
    for _ in range(4):
        p = store.start("pcm")
        p.write(b"x" * 100)
        p.finish()
        clock.now += 1
        names.append(p.name)
    assert [store.path(n) is not None for n in names] == [False, False, True, True]
    big = store.start("pcm")
    big.write(b"x" * 300)  # alone over the bound: not kept, and nothing else is lost for it
    big.finish()
    assert store.path(big.name) is None and store.path(names[3]) is not None
    assert "TTS_DOWNLOAD_MAX_BYTES" in store.why_missing(big.name)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 250


def test_the_file_count_is_bounded_oldest_first(tmp_path):
    store = AudioStore(tmp_path, ttl=3600, max_bytes=1 << 20, max_files=3)
    names = []
    for _ in range(5):
        p = store.start("mp3")
        p.write(b"x")
        p.finish()
        names.append(p.name)
    assert [store.path(n) is not None for n in names] == [False, False, True, True, True]
    assert len(list(tmp_path.iterdir())) == 3
    writing = [store.start("mp3") for _ in range(3)]  # the finished ones give way to files being written
    assert all(writing) and store.start("mp3") is None  # and a fourth has no slot
    assert list(tmp_path.glob("*.mp3")) == []


def test_files_being_written_count_against_the_byte_bound(tmp_path):
    store = AudioStore(tmp_path, ttl=3600, max_bytes=1000)
    done = store.start("pcm")
    done.write(b"x" * 300)
    done.finish()
    streams = [store.start("pcm") for _ in range(8)]
    for _ in range(10):  # eight streams growing together, 50 bytes at a time
        for p in streams:
            p.write(b"x" * 50)
            on_disk = sum(f.stat().st_size for f in tmp_path.iterdir())
            assert on_disk <= 1000 and store.count()[1] <= 1000
    kept = [p for p in streams if p.kept]
    assert kept and len(kept) < 8 and store.path(done.name) is None  # the finished file gave way first
    for p in streams:
        p.finish()
    for p in streams:
        if p.kept:
            assert store.path(p.name).stat().st_size == 500
        else:
            assert store.path(p.name) is None and "grew past" in store.why_missing(p.name)
    assert store.count() == (len(kept), 500 * len(kept))


def test_files_are_private(tmp_path):
    store = AudioStore(tmp_path / "dl", ttl=60, max_bytes=1 << 20)
    p = store.start("mp3")
    p.write(b"x")
    p.finish()
    assert (tmp_path / "dl").stat().st_mode & 0o777 == 0o700
    assert store.path(p.name).stat().st_mode & 0o777 == 0o600


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
