"""Audio out: float32 mono chunks -> bytes of wav, pcm, mp3, opus, flac or aac, as they arrive.

Per chunk: tempo change (WSOLA, pitch kept) -> resampling (soxr, streaming) -> the format's writer.
- wav: 16-bit PCM; streamed with RIFF/data sizes 0xFFFFFFFF ("to the end of the stream", which
  libsndfile and ffmpeg read to EOF); whole files get exact sizes.
- pcm: raw 16-bit little-endian, 24 kHz by default like OpenAI's.
- mp3 (LAME), opus (Ogg, pages every 20 ms, 48 kHz by default: Opus accepts 8/12/16/24/48 kHz),
  aac (ADTS): PyAV, progressive.
- flac: written whole when the audio ends, because its header carries the total length and a
  streamed header without it breaks common readers (libsndfile).
Samples are clipped to [-1, 1] before 16-bit conversion (upstream wraps around instead).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .time_stretch import TimeStretch

CONTENT_TYPES = {
    "wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac", "aac": "audio/aac",
}
FORMATS = tuple(CONTENT_TYPES)
DEFAULT_RATES = {"pcm": 24000, "opus": 48000}
# the rates each codec can open at (within our 8..48 kHz); any other made LAME / the AAC encoder fail after
# the headers had gone out
CODEC_RATES = {"opus": (8000, 12000, 16000, 24000, 48000),
               "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
               "aac": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)}
_AV = {"mp3": ("mp3", "libmp3lame", "fltp"), "opus": ("ogg", "libopus", "flt"), "aac": ("adts", "aac", "fltp")}


def check_output(fmt: str, sample_rate: int | None, speed: float) -> None:
    """Raises InputError for an output the encoders cannot produce (before any byte is sent)."""
    if fmt not in CONTENT_TYPES:
        raise InputError(f"unsupported audio format {fmt!r} (supported: {', '.join(FORMATS)})")
    if not 0.25 <= speed <= 4.0:
        raise InputError(f"speed must be within 0.25..4.0, got {speed}")
    output_rate(fmt, 44100, sample_rate)


def output_rate(fmt: str, native: int, requested: int | None) -> int:
    rate = requested or DEFAULT_RATES.get(fmt, native)
    if not 8000 <= rate <= 48000:
        raise InputError(f"sample_rate must be within 8000..48000, got {rate}")
    if rate not in CODEC_RATES.get(fmt, (rate,)):
        raise InputError(f"{fmt} needs a sample_rate of {', '.join(map(str, CODEC_RATES[fmt]))}, got {rate}")
    return rate


def to_int16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(rate: int, data_bytes: int | None) -> bytes:
    """16-bit mono; data_bytes None = unknown length (streaming)."""
    size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", size))


class _Collector(io.RawIOBase):
    """A write-only file PyAV can mux into; `take()` hands over what was written so far."""

    def __init__(self):
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


@dataclass
class EncodedAudio:
    data: bytes
    content_type: str
    sample_rate: int
    seconds: float


class AudioEncoder:
    """Streams one utterance: `encode(chunk)` returns the bytes ready so far, `finish()` the rest."""

    def __init__(self, fmt: str, native_rate: int, sample_rate: int | None = None, speed: float = 1.0,
                 streaming: bool = True):
        check_output(fmt, sample_rate, speed)
        self.fmt, self.native = fmt, native_rate
        self.rate = output_rate(fmt, native_rate, sample_rate)
        self.content_type = CONTENT_TYPES[fmt]
        self.streaming = streaming
        self._stretch = TimeStretch(speed, native_rate) if speed != 1.0 else None
        self._resampler = None
        if self.rate != native_rate:
            import soxr

            self._resampler = soxr.ResampleStream(native_rate, self.rate, 1, dtype="float32", quality="HQ")
        self._samples = 0  # output samples so far
        self._pcm: list[bytes] = []  # whole wav / flac: kept until finish
        self._started = False
        self._av = None

    @property
    def samples(self) -> int:
        """Output samples so far (after tempo change and resampling)."""
        return self._samples

    @property
    def seconds(self) -> float:
        return self._samples / self.rate

    # ---- stages -------------------------------------------------------------------------------
    def _condition(self, x: np.ndarray, last: bool) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if self._stretch is not None:
            x = np.concatenate([self._stretch.process(x), self._stretch.flush()]) if last else self._stretch.process(x)
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x, last=last)
        self._samples += len(x)
        return x

    def _write(self, x: np.ndarray, last: bool) -> bytes:
        if self.fmt == "pcm":
            return to_int16(x)
        if self.fmt == "wav":
            if not self.streaming:
                self._pcm.append(to_int16(x))
                if not last:
                    return b""
                data = b"".join(self._pcm)
                return wav_header(self.rate, len(data)) + data
            head = b"" if self._started else wav_header(self.rate, None)
            self._started = True
            return head + to_int16(x)
        if self.fmt == "flac":
            self._pcm.append(x.astype(np.float32).tobytes())
            if not last:
                return b""
            import soundfile as sf

            buf = io.BytesIO()
            sf.write(buf, np.frombuffer(b"".join(self._pcm), dtype=np.float32), self.rate, format="FLAC",
                     subtype="PCM_16")
            return buf.getvalue()
        return self._write_av(x, last)

    def _write_av(self, x: np.ndarray, last: bool) -> bytes:
        import av

        if self._av is None:
            container_fmt, codec, sample_fmt = _AV[self.fmt]
            sink = _Collector()
            options = {"page_duration": "20000"} if container_fmt == "ogg" else {}
            out = av.open(sink, "w", format=container_fmt, options=options)
            stream = out.add_stream(codec, rate=self.rate)
            stream.layout = "mono"
            if self.fmt == "mp3":
                stream.bit_rate = 128_000
            self._av = (sink, out, stream)
        sink, out, stream = self._av
        if len(x):
            frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
            frame.sample_rate = self.rate
            for packet in stream.encode(frame):
                out.mux(packet)
        if last:
            for packet in stream.encode(None):
                out.mux(packet)
            out.close()
        return sink.take()

    # ---- public -------------------------------------------------------------------------------
    def encode(self, chunk: np.ndarray) -> bytes:
        return self._write(self._condition(chunk, last=False), last=False)

    def finish(self) -> bytes:
        return self._write(self._condition(np.zeros(0, np.float32), last=True), last=True)


def encode_audio(audio: np.ndarray, native_rate: int, fmt: str, sample_rate: int | None = None,
                 speed: float = 1.0) -> EncodedAudio:
    """A whole utterance to one file (exact headers)."""
    enc = AudioEncoder(fmt, native_rate, sample_rate, speed, streaming=False)
    data = enc.encode(audio) + enc.finish()
    return EncodedAudio(data, enc.content_type, enc.rate, enc.seconds)
