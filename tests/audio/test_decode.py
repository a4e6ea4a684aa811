"""Bounded decode: the header is read first and over-long audio, or audio at an absurd sample rate, is rejected
before decoding; a header that hides its length is decoded in blocks that stop at the limit. A compressed file
of an hour of silence (a decompression bomb, ~0.5 MB of FLAC) never expands in memory."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT

from ttsengine import InputError
from ttsengine.audio import decode
from ttsengine.audio.decode import decode_mono, load_mono, read_header


def silence(seconds: int, rate: int = 44100, fmt: str = "FLAC", subtype: str | None = None, channels: int = 1) -> bytes:
    """Written 10 s at a time, so the test itself never holds the decoded hour."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, channels, format=fmt, subtype=subtype) as f:
        block = np.zeros((rate * 10, channels), np.float32)
        for _ in range(seconds // 10):
            f.write(block)
    return buf.getvalue()


def hide_length(flac: bytes) -> bytes:
    """STREAMINFO's total-samples field set to 0 ("unknown"): the length is found only by decoding."""
    out = bytearray(flac)
    assert out[:4] == b"fLaC"
    out[21] &= 0xF0
    out[22:26] = bytes(4)
    return bytes(out)


def tone(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = silence(3600)
    assert len(data) < 600_000  # an hour of 44.1 kHz audio, 635 MB as float32, in half a megabyte
    return data


def test_the_header_rejects_an_hour_before_decoding(bomb, monkeypatch):
    monkeypatch.setattr(sf.SoundFile, "read", lambda *a, **k: pytest.fail("decoded a sample"))
    with pytest.raises(InputError, match=r"^references\[0\]\.audio: 3600\.0 s is longer than the limit of 60 s$"):
        load_mono(bomb, 44100, "references[0].audio", max_seconds=60)
    assert read_header(bomb).seconds == 3600.0


def test_a_hidden_length_stops_decoding_at_the_limit(bomb):
    hidden = hide_length(bomb)
    assert read_header(hidden).frames is None
    with pytest.raises(InputError, match=r"^ref: is longer than the limit of 60 s \(decoding stopped at \d+\.\d s\)$"):
        load_mono(hidden, 44100, "ref", max_seconds=60)
    short = hide_length(silence(20))  # under the limit, it decodes to its full length
    assert len(decode_mono(short, "ref", 60)[0]) == 20 * 44100


@pytest.mark.parametrize("fmt, subtype", [("OGG", "VORBIS"), ("MP3", None), ("WAV", None)])
def test_other_containers_are_bounded_too(fmt, subtype):
    data = silence(70, 22050, fmt, subtype)
    with pytest.raises(InputError, match=r"longer than the limit of 60 s"):
        load_mono(data, 44100, "ref", max_seconds=60)
    ok = silence(20, 22050, fmt, subtype)
    assert abs(len(load_mono(ok, 44100, "ref", max_seconds=60)) - 20 * 44100) < 4096  # lossy codecs pad


def test_blocks_mix_down_like_the_whole_file():
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal((300_000, 3))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 16000, format="WAV", subtype="FLOAT")
    samples, rate = decode_mono(buf.getvalue(), "ref", 60)  # 300k x 3 values: several blocks
    assert rate == 16000 and np.allclose(samples, x.mean(axis=1), atol=1e-7)


@pytest.mark.parametrize("rate, words", [(8, "sample rate 8 Hz is outside 8000..384000 Hz"),
                                         (4000, "sample rate 4000 Hz is outside"),
                                         (768_000, "sample rate 768000 Hz is outside")])
def test_absurd_sample_rates_are_rejected_before_resampling(rate, words, monkeypatch):
    import soxr

    monkeypatch.setattr(soxr, "resample", lambda *a, **k: pytest.fail("resampled"))
    data = tone(50 if rate < 8000 else 0.1, rate)  # 50 s at 8 Hz took 6 s of soxr
    with pytest.raises(InputError, match=f"^ref: {words}"):
        load_mono(data, 44100, "ref", max_seconds=60)
    with pytest.raises(InputError, match="outside"):
        decode.resample(np.zeros(400, np.float32), rate, 44100)


def test_rates_at_the_bounds_decode():
    assert abs(len(load_mono(tone(0.5, 8000), 44100, "ref", 60)) - 22050) <= 1
    assert abs(len(load_mono(tone(0.1, 384_000), 44100, "ref", 60)) - 4410) <= 1


PEAK = textwrap.dedent("""
    import json, resource, sys
    from ttsengine.audio.decode import load_mono
    from ttsengine.errors import InputError
    data = open(sys.argv[1], "rb").read()
    load_mono(open(sys.argv[2], "rb").read(), 44100)  # imports and first-call allocations before measuring
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        load_mono(data, 44100, "references[0].audio", max_seconds=60)
        error = None
    except InputError as e:
        error = str(e)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth_mb": (after - before) / 1024, "error": error}))
""")


@pytest.mark.parametrize("hidden", [False, True], ids=["header", "hidden-length"])
def test_peak_memory_of_a_bomb_stays_bounded(bomb, hidden, tmp_path):
    """In a fresh process (ru_maxrss is a process-wide peak): decoding the hour whole took 635+ MB."""
    path = tmp_path / "bomb.flac"
    path.write_bytes(hide_length(bomb) if hidden else bomb)
    (tmp_path / "small.wav").write_bytes(tone(0.5, 22050))
    out = subprocess.run([sys.executable, "-c", PEAK, str(path), str(tmp_path / "small.wav")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": f"{ROOT / 'container'}:{ROOT}",
                                                                "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] and "longer than the limit of 60 s" in result["error"], result
    assert result["growth_mb"] < 200, result
