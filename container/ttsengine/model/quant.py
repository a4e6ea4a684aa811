"""Weight-only quantization of nn.Linear layers (DualAR and the codec's transformer/ConvNeXt linears).

int8 has several implementations, picked by `int8_kernel` (EngineConfig.int8_kernel, env TTS_INT8_KERNEL):

- `auto` (default): `fused` on CUDA when Triton and `torch.library.custom_op` (torch >= 2.4) are
  there, else `off`.
- `fused`: our Int8Linear whose forward is one opaque custom op. On CUDA with 16-bit activations and
  up to FUSED_MAX_ROWS rows it is a Triton kernel (model/int8.py) that reads the int8 weight
  and converts it in registers, scale and bias in the epilogue: the decode step's linears read half
  the bytes of bf16 and launch one kernel each. 1-2 rows take a CUDA-core GEMV kernel, more rows
  tensor-core tiles. Elsewhere (CPU, fp32, long prefills) the op dequantizes and calls F.linear.
  Being opaque, torch.compile cannot rewrite it (see `legacy` below).
- `tile`: `fused` without the GEMV kernel (its off switch).
- `dequant`: our Int8Linear as plain ops that dequantize the whole weight, then F.linear (Inductor
  writes a 16-bit copy of the weight every call, then cuBLAS).
- `off`: what this module did before: torchao's int8 weight-only config when torchao is installed,
  else our Int8Linear in the `legacy` form `F.linear(x, w.to(x.dtype)) * scale`. Note: under
  torch.compile (torch 2.11) Inductor pattern-matches that form, and torchao's, into
  `aten._weight_int8pack_mm`, whose CUDA kernel made the compiled decode step ~24x slower than bf16.

`fused` is the default because the compiled decode step measured fastest with it at both 2 and 64 rows,
`dequant` and `off` far slower (docs/performance.md, "int8 linears").

int4 needs torchao. Convolutions and embeddings keep the model dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import compiling, custom_ops_available, torchao_quantize
from ..errors import ConfigError
from .kernels.int8 import GEMV_MAX_ROWS, int8_linear_triton
from .kernels.triton_support import triton_available

MODES = ("bf16", "int8", "int4")
INT8_KERNELS = ("auto", "fused", "tile", "dequant", "off")
FUSED_MAX_ROWS = 512  # more rows (prefill, codec): dequantize + cuBLAS, compute-bound there anyway


class Int8Linear(nn.Module):
    """Per-output-channel symmetric int8 weights (fp32 scales), dequantised on the fly.

    kernel: "fused" (custom op, Triton on CUDA), "tile" (the same without the GEMV kernel), "dequant"
    (plain ops) or "legacy" (the pre-existing `F.linear(x, w.to(x.dtype)) * scale`, which Inductor
    turns into _weight_int8pack_mm).
    """

    def __init__(self, linear: nn.Linear, kernel: str = "legacy"):
        super().__init__()
        if kernel not in ("fused", "tile", "dequant", "legacy"):
            raise ValueError(f"unknown Int8Linear kernel {kernel!r}")
        w = linear.weight.detach()
        scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [out]
        self.register_buffer("weight_int8", torch.round(w.float() / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel = kernel
        self.gemv_rows = GEMV_MAX_ROWS if kernel == "fused" else 0
        if kernel in ("fused", "tile"):
            int8_linear_op()  # registers the custom op (where torch has custom ops)

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel in ("fused", "tile"):
            if _INT8_OP is not None and compiling():  # a trace sees the opaque op; eager calls the function
                return _INT8_OP(x, self.weight_int8, self.scale, self.bias, self.gemv_rows)
            return int8_linear(x, self.weight_int8, self.scale, self.bias, self.gemv_rows)
        if self.kernel == "dequant":
            w = (self.weight_int8.to(torch.float32) * self.scale[:, None]).to(x.dtype)
            return F.linear(x, w, self.bias)
        y = F.linear(x, self.weight_int8.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


# ---- the fused int8 linear --------------------------------------------------------------------------
def int8_linear_reference(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """x @ (weight_int8 * scale[:, None]).T + bias, in x's dtype."""
    y = F.linear(x, weight_int8.to(x.dtype)) * scale.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def int8_linear(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Tensor | None,
                gemv_rows: int = GEMV_MAX_ROWS) -> Tensor:
    """The fused op's implementation: the Triton kernels where they apply (the GEMV one up to
    `gemv_rows` rows), else the reference."""
    rows = x.numel() // max(x.shape[-1], 1)
    if (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and 0 < rows <= FUSED_MAX_ROWS
            and triton_available()):
        return int8_linear_triton(x, weight_int8, scale, bias, gemv_rows=gemv_rows)
    return int8_linear_reference(x, weight_int8, scale, bias)


_INT8_OP = None


def int8_linear_op():
    """`ttsengine::int8_weight_linear`, an opaque custom op (torch >= 2.4) so that torch.compile
    neither traces the Triton launch nor pattern-matches the dequantization; None on older torch."""
    global _INT8_OP
    if _INT8_OP is None and custom_ops_available():
        op = torch.library.custom_op("ttsengine::int8_weight_linear", mutates_args=())(_int8_linear_for_op)
        op.register_fake(lambda x, weight_int8, scale, bias, gemv_rows: x.new_empty((*x.shape[:-1],
                                                                                       weight_int8.shape[0])))
        _INT8_OP = op
    return _INT8_OP


def _int8_linear_for_op(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Optional[Tensor],  # noqa: UP045
                        gemv_rows: int) -> Tensor:  # (Optional: custom_op schema inference needs it)
    return int8_linear(x, weight_int8, scale, bias, gemv_rows)


# ---- choosing and applying ---------------------------------------------------------------------
def resolve_int8_kernel(requested: str | None, device: torch.device) -> str:
    """-> "fused", "tile", "dequant" or "off" for `requested` (None: auto; config passes TTS_INT8_KERNEL)."""
    kind = (requested or "auto").strip().lower()
    if kind not in INT8_KERNELS:
        raise ConfigError(f"TTS_INT8_KERNEL={kind!r} is not one of {', '.join(INT8_KERNELS)}")
    if kind == "auto":
        return "fused" if device.type == "cuda" and custom_ops_available() and triton_available() else "off"
    return kind


def quantizable(mode: str):
    def filter_fn(module: nn.Module, fqn: str = "") -> bool:
        if not isinstance(module, nn.Linear):
            return False
        # int4 kernels group 128 input channels; tiny layers stay in the model dtype
        return module.in_features % (128 if mode == "int4" else 16) == 0

    return filter_fn


def _replace_linears(model: nn.Module, filter_fn, kernel: str) -> None:
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if filter_fn(child):
                setattr(module, child_name, Int8Linear(child, kernel))


def quantize(model: nn.Module, mode: str, int8_kernel: str | None = None) -> str:
    """Quantizes `model` in place -> a one-line description of what was done. `int8_kernel`: see the
    module docstring (None: auto; the engine passes EngineConfig.int8_kernel, i.e. TTS_INT8_KERNEL)."""
    if mode in ("bf16", "none"):
        return "none"
    if mode not in MODES:
        raise ConfigError(f"TTS_QUANT={mode!r} is not one of {', '.join(MODES)}")
    p = next(model.parameters())
    if mode == "int4" and p.device.type != "cuda":
        raise ConfigError("TTS_QUANT=int4 needs a CUDA device")
    filter_fn = quantizable(mode)
    count = sum(filter_fn(m) for m in model.modules())
    if mode == "int8":
        kernel = resolve_int8_kernel(int8_kernel, p.device)
        if kernel in ("fused", "tile"):
            _replace_linears(model, filter_fn, kernel)
            how = ("Triton kernels" if kernel == "fused" else "Triton tile kernel") \
                if int8_linear_op() is not None and triton_available() else "eager fallback"
            return f"int8 (built-in int8 linear, {kernel}: {how}, {count} linear layers)"
        if kernel == "dequant":
            _replace_linears(model, filter_fn, "dequant")
            return f"int8 (built-in int8 linear, dequant, {count} linear layers)"
    used = torchao_quantize(model, mode, filter_fn)
    if used is not None and mode == "int4":
        for module in model.modules():
            if filter_fn(module):  # still nn.Linear: torchao swaps the weight tensor only
                module.register_forward_pre_hook(_contiguous_input)
    if used is None and mode == "int8":
        _replace_linears(model, filter_fn, "legacy")
        used = "built-in int8 linear"
    if used is None:
        raise ConfigError(f"TTS_QUANT={mode}: needs torchao (pip install torchao)")
    return f"{mode} ({used}, {count} linear layers)"


def _contiguous_input(module: nn.Module, args: tuple) -> tuple:
    # torch's int4 kernel (_weight_int4pack_mm) requires a contiguous activation; the decode step
    # hands some linears strided views (measured: "Expected A.is_contiguous()" from attention's wqkv)
    return (args[0].contiguous(), *args[1:])


MERGED_BUFFERS = ("w13", "w13_int8", "w13_scale")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers as stored (quantized tensors report their packed size). A merged W1|W3
    (layers.FeedForward.merge_inputs, merge_int8_inputs) holds the bytes of w1's and w3's weights, which are its
    views: not counted."""
    total = 0
    buffers = [t for name, t in model.named_buffers() if name.rsplit(".", 1)[-1] not in MERGED_BUFFERS]
    for t in list(model.parameters()) + buffers:
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
