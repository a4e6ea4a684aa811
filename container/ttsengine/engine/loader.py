"""Loading a model directory onto the configured device and dtypes."""

from __future__ import annotations

import logging
import time

import torch

from ..config import EngineConfig
from ..errors import ConfigError
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.quant import quantize

log = logging.getLogger(__name__)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"TTS_DEVICE={name}: CUDA is not available on this machine")
    return device


def resolve_dtype(name: str, device: torch.device, on_cuda: torch.dtype) -> torch.dtype:
    """auto: `on_cuda` on CUDA, float32 on CPU (the reference precision)."""
    if name == "auto":
        return on_cuda if device.type == "cuda" else torch.float32
    return DTYPES[name]


def apply_quantization(ckpt: Checkpoint, mode: str, int8_kernel: str = "auto") -> str:
    """Quantizes the DualAR's and the codec's linear layers in place -> what was done (for logs)."""
    if mode in ("bf16", "none"):
        return "bf16 (none)"
    start = time.perf_counter()
    done = f"DualAR {quantize(ckpt.model, mode, int8_kernel)}; codec {quantize(ckpt.codec, mode, int8_kernel)}"
    log.info("quantized in %.1f s: %s", time.perf_counter() - start, done)
    return done


def load(config: EngineConfig, random_weights: str | None = None) -> Checkpoint:
    """The configured model dir, or (bench, warm) random weights with the real shapes of `random_weights`
    (e.g. "s1-mini"), on the configured device, dtypes and quantization."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device, torch.bfloat16)
    codec_dtype = resolve_dtype(config.codec_dtype, device, torch.bfloat16)
    start = time.perf_counter()
    if random_weights:
        from ..model.synthetic import random_checkpoint

        ckpt = random_checkpoint(random_weights, device, dtype, codec_dtype)
    else:
        ckpt = load_checkpoint(config.model_dir, device, dtype, codec_dtype)
    log.info("loaded %s checkpoint from %s on %s (LLM %s, codec %s) in %.1f s", ckpt.family.NAME,
             f"random weights ({random_weights})" if random_weights else config.model_dir, device,
             str(dtype).removeprefix("torch."), str(codec_dtype).removeprefix("torch."), time.perf_counter() - start)
    ckpt.quantization = apply_quantization(ckpt, config.quant, config.int8_kernel)
    return ckpt
