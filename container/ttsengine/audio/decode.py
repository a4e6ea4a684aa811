"""Audio in: bytes of any file soundfile can read -> mono float32 at a target rate (soxr resampling)."""

from __future__ import annotations

import io

import numpy as np

from ..errors import InputError


def decode_audio(data: bytes, what: str = "audio") -> tuple[np.ndarray, int]:
    """-> (samples float32 [L, C], sample_rate). Raises InputError with one line on any problem."""
    import soundfile as sf

    if not data:
        raise InputError(f"{what}: empty")
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError/RuntimeError/TypeError by format
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{what}: cannot decode (unsupported format or corrupt file): {detail}") from None
    if samples.size == 0:
        raise InputError(f"{what}: contains no samples")
    if not np.isfinite(samples).all():
        raise InputError(f"{what}: contains NaN or infinite samples")
    return samples, int(rate)


def to_mono(samples: np.ndarray) -> np.ndarray:
    # [L, C] -> [L], the channel mean
    return samples.mean(axis=1, dtype=np.float32) if samples.ndim == 2 else samples.astype(np.float32)


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """x: float32 [L] -> [round(L * rate_out / rate_in)], soxr's high-quality sinc resampler."""
    if rate_in == rate_out:
        return x.astype(np.float32, copy=False)
    import soxr

    return soxr.resample(x, rate_in, rate_out, quality="HQ").astype(np.float32, copy=False)


def load_mono(data: bytes, rate: int, what: str = "audio", max_seconds: float | None = None) -> np.ndarray:
    samples, rate_in = decode_audio(data, what)
    seconds = samples.shape[0] / rate_in
    if max_seconds is not None and seconds > max_seconds:
        raise InputError(f"{what}: {seconds:.1f} s is longer than the limit of {max_seconds:g} s")
    return resample(to_mono(samples), rate_in, rate)
