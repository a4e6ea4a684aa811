"""Audio in: bytes of any file soundfile can read -> mono float32 at a target rate (soxr resampling).

Bounded: the header is read first (sample rate, channels, length) and over-long audio or absurd rates are
rejected before a sample is decoded; the samples are then decoded in blocks, mixed down to mono block by
block, and decoding stops as soon as the length limit is passed, so neither a header that hides its length
(frames unknown) nor one that lies can make a small compressed file expand into gigabytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, scrub

# Sample rates accepted for reference audio. 8 kHz is telephone speech, the lowest rate at which speech is
# still intelligible (and the floor of every common codec); below it there is no voice to clone and soxr's
# cost grows with the up-sampling ratio (8 Hz -> 44.1 kHz took seconds). 384 kHz is the highest rate audio
# interfaces record; above it is no real audio, only a way to make a short file decode to many samples.
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 384_000
BLOCK_VALUES = 1 << 18  # samples (frames x channels) decoded per block: 1 MB of float32
UNKNOWN_FRAMES = 1 << 62  # libsndfile reports SF_COUNT_MAX when a container does not give its length


@dataclass(frozen=True)
class AudioHeader:
    sample_rate: int
    channels: int
    frames: int | None  # None: the container does not say (decoding finds out)
    format: str

    @property
    def seconds(self) -> float | None:
        return None if self.frames is None else self.frames / self.sample_rate


def _open(data: bytes, what: str):
    import soundfile as sf

    if not data:
        raise InputError(f"{what}: empty")
    try:
        return sf.SoundFile(io.BytesIO(data))
    except Exception as e:  # soundfile raises LibsndfileError/RuntimeError/TypeError by format
        raise InputError(f"{what}: cannot decode (unsupported format or corrupt file): {_detail(e)}") from None


def _detail(e: Exception) -> str:
    """The decoder's reason, one line, without the object reprs libsndfile's errors carry ("Error opening
    <_io.BytesIO object at 0x7f...>: Format not recognised.": a heap address says nothing to a client)."""
    text = str(e).strip()
    text = scrub(text.splitlines()[0]) if text else ""
    return text or type(e).__name__


def _check_header(f, what: str, max_seconds: float | None) -> AudioHeader:
    rate, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
    header = AudioHeader(rate, channels, None if frames < 0 or frames >= UNKNOWN_FRAMES else frames, str(f.format))
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise InputError(f"{what}: sample rate {rate} Hz is outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    if channels < 1:
        raise InputError(f"{what}: has {channels} channels")
    if max_seconds is not None and header.seconds is not None and header.seconds > max_seconds:
        raise _too_long(what, header.seconds, max_seconds)
    return header


def _too_long(what: str, seconds: float, max_seconds: float, decoding: bool = False) -> InputError:
    if decoding:  # the header did not say: decoding stopped at the limit
        return InputError(f"{what}: is longer than the limit of {max_seconds:g} s (decoding stopped at "
                          f"{seconds:.1f} s)")
    return InputError(f"{what}: {seconds:.1f} s is longer than the limit of {max_seconds:g} s")


def read_header(data: bytes, what: str = "audio", max_seconds: float | None = None) -> AudioHeader:
    """The container's header only (no samples decoded): InputError if unreadable, its rate is out of range or
    the length it declares is over max_seconds."""
    with _open(data, what) as f:
        return _check_header(f, what, max_seconds)


def decode_mono(data: bytes, what: str = "audio", max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """-> (samples float32 [L] mono, sample_rate), decoded in blocks; at most max_seconds of audio is ever held
    (plus one block). Raises InputError with one line on any problem."""
    with _open(data, what) as f:
        header = _check_header(f, what, max_seconds)
        parts = [to_mono(x) for x in _blocks(f, header, what, max_seconds, check=True)]
    if not parts:
        raise InputError(f"{what}: contains no samples")
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)), header.sample_rate


def measure(data: bytes, what: str = "audio", max_seconds: float | None = None, stop_after: int | None = None) -> int:
    """Frames (samples per channel) of audio whose header does not give its length, found by decoding it block by
    block and keeping nothing; from the header where it does. Stops as soon as more than `stop_after` frames were
    seen (-> that count: more than stop_after, not the whole length) or max_seconds was passed (InputError), so
    its cost is bounded by what the caller still has room for, not by the file."""
    with _open(data, what) as f:
        header = _check_header(f, what, max_seconds)
        if header.frames is not None:
            return header.frames
        total = 0
        for x in _blocks(f, header, what, max_seconds, check=False):
            total += x.shape[0]
            if stop_after is not None and total > stop_after:
                break
        return total


def _blocks(f, header: AudioHeader, what: str, max_seconds: float | None, check: bool):
    """The samples of an open file, float32 [block, channels] at a time (one buffer, reused: copy what you keep);
    InputError past max_seconds, or (check) at NaN or infinite samples."""
    rate, channels = header.sample_rate, header.channels
    limit = None if max_seconds is None else int(max_seconds * rate)
    block = max(256, BLOCK_VALUES // channels)
    buffer = np.empty((block, channels), np.float32)  # given `out`, soundfile does not seek to size reads
    # reads are sequential: without this soundfile seeks after every block (tell, then seek to where it is),
    # which libsndfile refuses at the end of a FLAC whose header gives no length
    f.seekable = lambda: False
    total = 0
    while True:
        try:
            x = f.read(out=buffer)
        except Exception as e:
            raise InputError(f"{what}: cannot decode (unsupported format or corrupt file): {_detail(e)}") from None
        if x.shape[0] == 0:
            return
        if check and not np.isfinite(x).all():
            raise InputError(f"{what}: contains NaN or infinite samples")
        total += x.shape[0]
        if limit is not None and total > limit:
            raise _too_long(what, total / rate, max_seconds, decoding=True)
        yield x
        if x.shape[0] < block:
            return


def to_mono(samples: np.ndarray) -> np.ndarray:
    # [L, C] -> [L], the channel mean
    if samples.ndim == 2:
        return samples[:, 0].copy() if samples.shape[1] == 1 else samples.mean(axis=1, dtype=np.float32)
    return samples.astype(np.float32)


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """x: float32 [L] -> [round(L * rate_out / rate_in)], soxr's high-quality sinc resampler."""
    if rate_in == rate_out:
        return x.astype(np.float32, copy=False)
    if not MIN_SAMPLE_RATE <= rate_in <= MAX_SAMPLE_RATE:  # the ratio soxr would face; decode checks it first
        raise InputError(f"sample rate {rate_in} Hz is outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    import soxr

    return soxr.resample(x, rate_in, rate_out, quality="HQ").astype(np.float32, copy=False)


def load_mono(data: bytes, rate: int, what: str = "audio", max_seconds: float | None = None) -> np.ndarray:
    """Any soundfile-readable bytes -> float32 [L] mono at `rate`; InputError (one line) if unreadable, out of
    range or longer than max_seconds, found from the header before decoding where the header says."""
    samples, rate_in = decode_mono(data, what, max_seconds)
    return resample(samples, rate_in, rate)
