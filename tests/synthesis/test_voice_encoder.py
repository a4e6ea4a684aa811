"""Reference audio in odd forms: every readable form encodes, every broken one is a clear InputError."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from ttsengine import InputError, Reference, SynthesisRequest
from ttsengine.audio.decode import load_mono


def _audio(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.stack([x, 0.5 * x], axis=1) if channels == 2 else x


def frames_for(seconds: float) -> int:
    return math.ceil(round(seconds * 44100) / 2048)


@pytest.mark.parametrize("name, data, seconds", [
    ("stereo 48 kHz FLAC", lambda: _audio(_tone(1.0, 48000, 2), 48000, "FLAC"), 1.0),
    ("8-bit WAV 22.05 kHz", lambda: _audio(_tone(0.5, 22050), 22050, "WAV", "PCM_U8"), 0.5),
    ("24-bit WAV", lambda: _audio(_tone(0.5, 44100), 44100, "WAV", "PCM_24"), 0.5),
    ("float WAV 16 kHz", lambda: _audio(_tone(0.5, 16000), 16000, "WAV", "FLOAT"), 0.5),
    ("OGG Vorbis", lambda: _audio(_tone(0.5, 44100), 44100, "OGG", "VORBIS"), 0.5),
    ("MP3", lambda: _audio(_tone(0.5, 44100), 44100, "MP3"), 0.5),
    ("pure silence", lambda: _audio(np.zeros(44100, np.float32), 44100, "WAV"), 1.0),
    ("0.1 s", lambda: _audio(_tone(0.1, 44100), 44100, "WAV"), 0.1),
])
def test_readable_forms_encode(eager_engine, name, data, seconds):
    codes = eager_engine.voice_encoder.codes_from_bytes(data())
    n = eager_engine.ckpt.config.num_codebooks
    assert codes.dtype.is_floating_point is False and codes.shape[0] == n
    # MP3 and OGG decoders may pad a few samples; allow one frame either way for lossy formats
    assert abs(codes.shape[1] - frames_for(seconds)) <= (1 if name in ("MP3", "OGG Vorbis") else 0), codes.shape
    assert int(codes[0].max()) < eager_engine.ckpt.tokenizer.num_semantic


def test_resampling_and_mixdown():
    stereo = _tone(1.0, 48000, 2)
    mono = load_mono(_audio(stereo, 48000, "FLAC"), 44100)
    assert mono.dtype == np.float32 and abs(len(mono) - 44100) <= 1
    # channel mean of (x, 0.5x) = 0.75x: the peak survives resampling closely
    assert abs(float(np.abs(mono).max()) - 0.75 * 0.3) < 0.01


@pytest.mark.parametrize("data, pattern", [
    (b"definitely not audio" * 50, r"cannot decode"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt ", r"cannot decode"),
    (b"", r"empty"),
])
def test_broken_audio_is_a_clear_error(eager_engine, data, pattern):
    with pytest.raises(InputError, match=pattern):
        eager_engine.voice_encoder.codes_from_bytes(data)


def test_truncated_flac_is_a_clear_error(eager_engine):
    data = _audio(_tone(1.0, 44100), 44100, "FLAC")
    with pytest.raises(InputError, match="cannot decode|no samples"):
        eager_engine.voice_encoder.codes_from_bytes(data[:60])


def test_too_long_and_non_finite(eager_engine):
    long = _audio(np.zeros(int(44100 * (eager_engine.config.max_reference_seconds + 1)), np.float32), 44100, "WAV")
    with pytest.raises(InputError, match=r"longer than the limit of 60 s"):
        eager_engine.voice_encoder.codes_from_bytes(long)
    bad = _tone(0.2, 44100)
    bad[100] = np.nan
    with pytest.raises(InputError, match="NaN"):
        eager_engine.voice_encoder.codes_from_bytes(_audio(bad, 44100, "WAV", "FLOAT"))
    with pytest.raises(InputError, match="contains no samples"):
        eager_engine.voice_encoder.codes_from_bytes(_audio(np.zeros(0, np.float32), 44100, "WAV"))


def test_encoding_is_cached_by_content(eager_engine):
    data = _audio(_tone(0.3, 44100), 44100, "WAV")
    first = eager_engine.voice_encoder.codes_from_bytes(data)
    assert eager_engine.voice_encoder.codes_from_bytes(data) is first
    assert eager_engine.voice_encoder.codes_from_bytes(data + b"") is first  # same bytes, same key
    other = eager_engine.voice_encoder.codes_from_bytes(_audio(_tone(0.3, 44100) * 0.5, 44100, "WAV"))
    assert other is not first


def test_request_with_bad_reference_names_it(eager_engine):
    with pytest.raises(InputError, match=r"references\[1\]\.audio: cannot decode"):
        eager_engine.start(SynthesisRequest(text="hi", references=(
            Reference(text="a", audio=_audio(_tone(0.2, 44100), 44100, "WAV")),
            Reference(text="b", audio=b"junk" * 20))))


def test_stored_codes_are_checked(eager_engine):
    n = eager_engine.ckpt.config.num_codebooks
    bad = np.zeros((n, 3), dtype=np.int64)
    bad[0, 0] = 999
    with pytest.raises(InputError, match=r"references\[0\]: code values out of range"):
        eager_engine.start(SynthesisRequest(text="hi", references=(Reference(text="a", codes=bad),)))
    with pytest.raises(InputError, match=r"must have shape \[4, frames\]"):
        eager_engine.start(SynthesisRequest(text="hi", references=(Reference(text="a", codes=np.zeros((2, 3))),)))


def _silence_flac(seconds: int, rate: int = 44100) -> bytes:
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, 1, format="FLAC") as f:
        for _ in range(seconds // 10):
            f.write(np.zeros(rate * 10, np.float32))
    return buf.getvalue()


def test_a_decompression_bomb_is_rejected_before_decoding(eager_engine, monkeypatch):
    import ttsengine.synthesis.voice_encoder as ve

    bomb = _silence_flac(3600)  # ~0.5 MB, 635 MB as float32
    monkeypatch.setattr(ve, "load_mono", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(InputError, match=r"^references\[0\]\.audio: 3600\.0 s is longer than the limit of 60 s$"):
        eager_engine.start(SynthesisRequest(text="hi", references=(Reference(text="a", audio=bomb),)))


def test_at_most_two_references_are_decoded_and_encoded_at_once(eager_engine, monkeypatch):
    import threading
    import time

    import ttsengine.synthesis.voice_encoder as ve

    encoder, lock, state = eager_engine.voice_encoder, threading.Lock(), {"now": 0, "most": 0}
    encode = encoder.codes_from_samples

    def slow(samples):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.2)
        with lock:
            state["now"] -= 1
        return encode(samples)

    monkeypatch.setattr(encoder, "codes_from_samples", slow)
    datas = [_audio(_tone(0.2, 44100) * (0.1 + 0.1 * i), 44100, "WAV") for i in range(6)]
    threads = [threading.Thread(target=encoder.codes_from_bytes, args=(d,)) for d in datas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["most"] == ve.DECODE_SLOTS == 2, state
    assert all(encoder.cached(d) is not None for d in datas)


def test_encoding_waits_for_the_gpu_lock(eager_engine):
    # the engine passes its capture lock while the codec's graphs are captured with cuDNN autotuning on
    import threading

    from ttsengine.synthesis.voice_encoder import VoiceEncoder

    lock = threading.Lock()
    enc = VoiceEncoder(eager_engine.ckpt.codec, 30.0, 4, gpu_lock=lock)
    samples = _tone(0.2, 44100)
    box: list = []
    with lock:
        worker = threading.Thread(target=lambda: box.append(enc.codes_from_samples(samples)))
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive() and not box  # blocked while the lock is held
    worker.join(timeout=30)
    assert not worker.is_alive() and box[0].shape[0] == eager_engine.ckpt.config.num_codebooks
    assert torch.equal(box[0], eager_engine.voice_encoder.codes_from_samples(samples))
