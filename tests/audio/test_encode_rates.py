"""Every sample rate an encoder is allowed to take opens it for real; the others are a 400 before any byte is
sent (LAME at 9,528 Hz failed after the response's headers had gone out)."""

from __future__ import annotations

import numpy as np
import pytest

from ttsengine import InputError
from ttsengine.audio.encode import CODEC_RATES, check_output, encode_audio

TONE = (0.1 * np.sin(np.arange(44100) / 10)).astype(np.float32)  # 1 s at the codec's 44.1 kHz


@pytest.mark.parametrize("fmt, rate", [(f, r) for f, rates in CODEC_RATES.items() for r in rates])
def test_each_allowed_rate_encodes(fmt, rate):
    out = encode_audio(TONE, 44100, fmt, sample_rate=rate)
    assert out.sample_rate == rate and len(out.data) > 100 and abs(out.seconds - 1.0) < 0.01


@pytest.mark.parametrize("fmt", sorted(CODEC_RATES))
def test_other_rates_are_refused_up_front(fmt):
    with pytest.raises(InputError, match=f"{fmt} needs a sample_rate of 8000, "):
        check_output(fmt, 9528, 1.0)
    check_output("wav", 9528, 1.0)  # PCM-based formats take any rate in 8..48 kHz
