"""Reference voices: audio bytes -> codec codes, cached by content hash (LRU).

Decoding and encoding a reference holds up to max_seconds of audio and the codec's activations for it, so at
most DECODE_SLOTS references are decoded and encoded at once in the process (parallel requests queue), and
`header_frames` gives a reference's length in code frames from its header (`measured_frames`, where the header does
not say: from a decode that keeps nothing and stops at the room left), for the planner's cheap checks before any
encoding.
`encoded` counts the references run through the codec (the engine's stats: tts_references_encoded_total)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ..audio.decode import load_mono, measure, read_header
from ..errors import Abandoned
from ..model.codec import Codec

log = logging.getLogger(__name__)

DECODE_SLOTS = 2  # references decoded + encoded at once, process-wide (each up to max_seconds of audio)
_decoding = threading.BoundedSemaphore(DECODE_SLOTS)
SLOT_POLL = 0.1  # seconds between checks, while waiting for a decode slot, whether the client is still there


class VoiceEncoder:
    def __init__(self, codec: Codec, max_seconds: float, cache_size: int, gpu_lock: threading.Lock | None = None):
        """gpu_lock: held around the encoder's GPU work (the engine's capture lock while the codec's graphs are
        captured with cuDNN autotuning on, a process-wide flag that must not reach an encoding)."""
        self.codec = codec
        self.gpu_lock = gpu_lock
        self.max_seconds = max_seconds
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0  # references run through the codec's encoder (cache misses)

    def codes_from_samples(self, samples: np.ndarray) -> Tensor:
        """samples: float32 [L] mono at the codec's rate -> codes int64 [n, ceil(L / frame_length)] on CPU.
        Encoding runs in the codec's dtype without autocast (upstream encodes references in fp32)."""
        p = next(self.codec.parameters())
        x = torch.from_numpy(np.ascontiguousarray(samples)).to(device=p.device, dtype=p.dtype)[None, None]
        on_device = torch.cuda.device(p.device) if p.device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), (self.gpu_lock or contextlib.nullcontext()), on_device:  # a request's thread
            return self.codec.encode(x)[0].cpu()

    def cached(self, data: bytes, key: str | None = None) -> Tensor | None:
        key = key or hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        return None

    def header_frames(self, data: bytes, what: str = "reference audio") -> int | None:
        """Code frames this audio will encode to, from its header (no samples decoded; None where the container
        does not give its length). Raises InputError for unreadable headers, rates out of range and audio whose
        header says it is longer than max_seconds."""
        codes = self.cached(data)
        if codes is not None:
            return int(codes.shape[1])
        header = read_header(data, what, self.max_seconds)
        return None if header.frames is None else self._code_frames(header.frames, header.sample_rate)

    def measured_frames(self, data: bytes, room: int, what: str = "reference audio") -> int:
        """Code frames of audio whose header does not give its length (e.g. a FLAC whose STREAMINFO says 0
        samples), found by decoding it without keeping the samples (never encoded), stopping once it is over
        `room` frames (-> more than room, not the whole count). InputError as header_frames, or past max_seconds."""
        rate = read_header(data, what, self.max_seconds).sample_rate
        stop = math.ceil((room + 1) * self.codec.frame_length * rate / self.codec.sample_rate)
        return self._code_frames(measure(data, what, self.max_seconds, stop_after=stop), rate)

    def _code_frames(self, frames: int, rate: int) -> int:
        # the resampled length, rounded down, so this never overstates what encoding gives
        return math.floor(frames * self.codec.sample_rate / rate / self.codec.frame_length)

    def codes_from_bytes(self, data: bytes, what: str = "reference audio",
                         abandoned: Callable[[], bool] | None = None) -> Tensor:
        """abandoned: True once nobody waits for the codes: checked while waiting for a decode slot and before the
        work starts (Abandoned), so a request whose client left does not decode and encode for nobody."""
        key = hashlib.sha256(data).hexdigest()
        codes = self.cached(data, key)
        if codes is not None:
            return codes
        read_header(data, what, self.max_seconds)  # cheap rejections without waiting for a slot
        while not _decoding.acquire(timeout=SLOT_POLL):
            Abandoned.check(abandoned)
        try:
            Abandoned.check(abandoned)
            samples = load_mono(data, self.codec.sample_rate, what, self.max_seconds)
            if float(np.abs(samples).max()) < 1e-4:
                log.warning("%s is silent; the cloned voice will be poor", what)
            Abandoned.check(abandoned)  # the encoding is the costly part
            codes = self.codes_from_samples(samples)
            del samples
        finally:
            _decoding.release()
        with self._lock:
            self.encoded += 1
            self._cache[key] = codes
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return codes
