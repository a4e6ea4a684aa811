"""Loading a model directory onto the configured device and dtypes."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from ..config import EngineConfig
from ..errors import ConfigError
from ..model.loading import codec_cache
from ..model.loading.checkpoint import Checkpoint, load_checkpoint
from ..model.loading.replicate import copy_to
from ..model.quant import quantize
from .device.compile.early_jit import key_kernels_ahead
from .features import CODEC_CACHE, EARLY_JIT, LAZY_COMPILER, switched_off

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


def keys_ahead(device: torch.device, config: EngineConfig) -> bool:
    """Whether a load on `device` keys our Triton kernels in a thread beside it (feature early_jit): on CUDA only,
    where they launch."""
    return device.type == "cuda" and not switched_off(config.features, EARLY_JIT)


def load(config: EngineConfig, random_weights: str | None = None, quantize: bool = True) -> Checkpoint:
    """The configured model dir, or (bench, warm) random weights with the real shapes of `random_weights`
    (e.g. "s1-mini"), on the configured devices, dtypes and quantization (quantize=False: left for the caller)."""
    device = resolve_device(config.device)
    codec_device = resolve_device(config.codec_device) if config.codec_device else device
    dtype = resolve_dtype(config.dtype, device, torch.bfloat16)
    codec_dtype = resolve_dtype(config.codec_dtype, codec_device, torch.bfloat16)
    start = time.perf_counter()
    if keys_ahead(device, config):
        key_kernels_ahead(config.quant)  # beside the read and the upload; Device waits for it before its warm-up
    if random_weights:
        from ..model.loading.synthetic import random_checkpoint

        ckpt = random_checkpoint(random_weights, device, dtype, codec_dtype, codec_device=codec_device)
    else:
        cache = codec_cache.make(config.cache_dir, "off" if switched_off(config.features, CODEC_CACHE) else "auto")
        ckpt = load_checkpoint(config.model_dir, device, dtype, codec_dtype, codec_device, cache,
                               import_compiler=switched_off(config.features, LAZY_COMPILER))
    log.info("loaded %s checkpoint from %s on %s (LLM %s, codec %s%s, codec cache %s) in %.1f s", ckpt.family.NAME,
             f"random weights ({random_weights})" if random_weights else config.model_dir, device,
             str(dtype).removeprefix("torch."), str(codec_dtype).removeprefix("torch."),
             f" on {codec_device}" if codec_device != device else "", ckpt.codec_cache, time.perf_counter() - start)
    if quantize:
        ckpt.quantization = apply_quantization(ckpt, config.quant, config.int8_kernel)
    return ckpt


def load_all(configs: list[EngineConfig], random_weights: str | None = None) -> list[Checkpoint]:
    """One checkpoint per engine config (placement.engine_configs): read from disk once, onto the first
    engine's devices, then copied device to device for the others; each quantized where it lives."""
    first = load(configs[0], random_weights, quantize=False)
    ckpts = [first]
    for config in configs[1:]:
        start = time.perf_counter()
        device = resolve_device(config.device)
        codec_device = resolve_device(config.codec_device) if config.codec_device else device
        ckpts.append(replace(first, model=copy_to(first.model, device), codec=copy_to(first.codec, codec_device)))
        log.info("copied the checkpoint to %s%s in %.1f s", device,
                 f" (codec {codec_device})" if codec_device != device else "", time.perf_counter() - start)
    for ckpt, config in zip(ckpts, configs):
        ckpt.quantization = apply_quantization(ckpt, config.quant, config.int8_kernel)
    return ckpts
