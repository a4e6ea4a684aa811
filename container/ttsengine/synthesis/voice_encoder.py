"""Reference voices: audio bytes -> codec codes, cached by content hash (LRU)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor

from ..audio.decode import load_mono
from ..model.codec import Codec

log = logging.getLogger(__name__)


class VoiceEncoder:
    def __init__(self, codec: Codec, max_seconds: float, cache_size: int):
        self.codec = codec
        self.max_seconds = max_seconds
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def codes_from_samples(self, samples: np.ndarray) -> Tensor:
        """samples: float32 [L] mono at the codec's rate -> codes int64 [n, ceil(L / frame_length)] on CPU.
        Encoding runs in the codec's dtype without autocast (upstream encodes references in fp32)."""
        p = next(self.codec.parameters())
        x = torch.from_numpy(np.ascontiguousarray(samples)).to(device=p.device, dtype=p.dtype)[None, None]
        with torch.inference_mode():
            return self.codec.encode(x)[0].cpu()

    def codes_from_bytes(self, data: bytes, what: str = "reference audio") -> Tensor:
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        samples = load_mono(data, self.codec.sample_rate, what, self.max_seconds)
        if float(np.abs(samples).max()) < 1e-4:
            log.warning("%s is silent; the cloned voice will be poor", what)
        codes = self.codes_from_samples(samples)
        with self._lock:
            self._cache[key] = codes
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return codes
