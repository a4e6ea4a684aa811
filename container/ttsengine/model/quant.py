"""Weight-only quantization of nn.Linear layers (DualAR and the codec's transformer/ConvNeXt linears).

torchao when it is installed (whichever of its APIs this version has, see compat.torchao_quantize);
for int8 without torchao, a small built-in int8 linear. Convolutions and embeddings keep the model
dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import torchao_quantize
from ..errors import ConfigError

MODES = ("bf16", "int8", "int4")


class Int8Linear(nn.Module):
    """Per-output-channel symmetric int8 weights, dequantised on the fly (half the bytes read)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [out]
        self.register_buffer("weight_int8", torch.round(w.float() / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(w.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight_int8.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


def _eligible(mode: str):
    def filter_fn(module: nn.Module, fqn: str = "") -> bool:
        if not isinstance(module, nn.Linear):
            return False
        # int4 kernels group 128 input channels; tiny layers stay in the model dtype
        return module.in_features % (128 if mode == "int4" else 16) == 0

    return filter_fn


def quantize(model: nn.Module, mode: str) -> str:
    """Quantizes `model` in place -> a one-line description of what was done."""
    if mode in ("bf16", "none"):
        return "none"
    if mode not in MODES:
        raise ConfigError(f"TTS_QUANT={mode!r} is not one of {', '.join(MODES)}")
    p = next(model.parameters())
    if mode == "int4" and p.device.type != "cuda":
        raise ConfigError("TTS_QUANT=int4 needs a CUDA device")
    filter_fn = _eligible(mode)
    count = sum(filter_fn(m) for m in model.modules())
    used = torchao_quantize(model, mode, filter_fn)
    if used is None and mode == "int8":
        for module in list(model.modules()):
            for child_name, child in list(module.named_children()):
                if filter_fn(child):
                    setattr(module, child_name, Int8Linear(child))
        used = "built-in int8 linear"
    if used is None:
        raise ConfigError(f"TTS_QUANT={mode}: needs torchao (pip install torchao)")
    return f"{mode} ({used}, {count} linear layers)"


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as stored (quantized tensors report their packed size)."""
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        inner = getattr(t, "__tensor_flatten__", None)
        if inner is not None:  # a torchao tensor subclass: count its components
            names, _ = t.__tensor_flatten__()
            total += sum(_nbytes(getattr(t, n)) for n in names)
        else:
            total += t.numel() * t.element_size()
    return total


def _nbytes(t) -> int:
    inner = getattr(t, "__tensor_flatten__", None)
    if inner is not None:
        names, _ = t.__tensor_flatten__()
        return sum(_nbytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()
