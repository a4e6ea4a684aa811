"""Weight-only quantization of nn.Linear layers (DualAR and the codec's transformer/ConvNeXt linears).

int8 has several implementations, picked by `int8_kernel` (EngineConfig.int8_kernel, env TTS_INT8_KERNEL):

- `auto` (default): `fused` on CUDA when Triton and `torch.library.custom_op` (torch >= 2.4) are
  there, else `off`.
- `fused`: our Int8Linear whose forward is one opaque custom op. On CUDA with 16-bit activations and
  up to FUSED_MAX_ROWS rows it is a Triton kernel that reads the int8 weight, converts it in
  registers and multiplies on tensor cores, scale and bias in the epilogue: the decode step's
  linears read half the bytes of bf16 and launch one kernel each. Elsewhere (CPU, fp32, long
  prefills) the op dequantizes and calls F.linear. Being opaque, torch.compile cannot rewrite it
  (see `legacy` below).
- `dequant`: our Int8Linear as plain ops that dequantize the whole weight, then F.linear (Inductor
  writes a 16-bit copy of the weight every call, then cuBLAS).
- `off`: what this module did before: torchao's int8 weight-only config when torchao is installed,
  else our Int8Linear in the `legacy` form `F.linear(x, w.to(x.dtype)) * scale`. Note: under
  torch.compile (torch 2.11) Inductor pattern-matches that form, and torchao's, into
  `aten._weight_int8pack_mm`, whose CUDA kernel made the compiled decode step ~24x slower than bf16.

Measured on an H100 (torch 2.11, random-weight S1-mini, compiled decode step in a CUDA graph, ms at
64 / 2 rows): bf16 7.39 / 4.78, fused 7.42 / 4.67 (same machine and process); dequant 9.57 / 6.85;
off (torchao or legacy) 168 / 26-27. Per linear the fused kernel is about as fast as cuBLAS bf16
(these are latency-bound) and twice as fast on the vocabulary head.

int4 needs torchao. Convolutions and embeddings keep the model dtype.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import custom_ops_available, torchao_quantize
from ..errors import ConfigError

MODES = ("bf16", "int8", "int4")
INT8_KERNELS = ("auto", "fused", "dequant", "off")
FUSED_MAX_ROWS = 512  # more rows (prefill, codec): dequantize + cuBLAS, compute-bound there anyway


class Int8Linear(nn.Module):
    """Per-output-channel symmetric int8 weights (fp32 scales), dequantised on the fly.

    kernel: "fused" (custom op, Triton on CUDA), "dequant" (plain ops) or "legacy" (the
    pre-existing `F.linear(x, w.to(x.dtype)) * scale`, which Inductor turns into _weight_int8pack_mm).
    """

    def __init__(self, linear: nn.Linear, kernel: str = "legacy"):
        super().__init__()
        if kernel not in ("fused", "dequant", "legacy"):
            raise ValueError(f"unknown Int8Linear kernel {kernel!r}")
        w = linear.weight.detach()
        scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [out]
        self.register_buffer("weight_int8", torch.round(w.float() / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel = kernel
        if kernel == "fused":
            int8_linear_op()  # registers the custom op (where torch has custom ops)

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "fused":
            if _INT8_OP is not None:
                return _INT8_OP(x, self.weight_int8, self.scale, self.bias)
            return int8_linear(x, self.weight_int8, self.scale, self.bias)
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


def int8_linear(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """The fused op's implementation: the Triton kernel where it applies, else the reference."""
    rows = x.numel() // max(x.shape[-1], 1)
    if (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and 0 < rows <= FUSED_MAX_ROWS
            and triton_available()):
        return int8_linear_triton(x, weight_int8, scale, bias)
    return int8_linear_reference(x, weight_int8, scale, bias)


_INT8_OP = None


def int8_linear_op():
    """`ttsengine::int8_weight_linear`, an opaque custom op (torch >= 2.4) so that torch.compile
    neither traces the Triton launch nor pattern-matches the dequantization; None on older torch."""
    global _INT8_OP
    if _INT8_OP is None and custom_ops_available():
        op = torch.library.custom_op("ttsengine::int8_weight_linear", mutates_args=())(_int8_linear_for_op)
        op.register_fake(lambda x, weight_int8, scale, bias: x.new_empty((*x.shape[:-1], weight_int8.shape[0])))
        _INT8_OP = op
    return _INT8_OP


def _int8_linear_for_op(x: Tensor, weight_int8: Tensor, scale: Tensor,
                        bias: Optional[Tensor]) -> Tensor:  # noqa: UP045 - custom_op schema inference
    return int8_linear(x, weight_int8, scale, bias)


def triton_available() -> bool:
    return _triton_available()


@functools.lru_cache(maxsize=1)
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - absent or broken: the reference path
        return False
    return True


def _build_triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])
    def int8_weight_linear_kernel(X, W, S, BIAS, Y, M, N, K, s_xm, s_wn, s_ym,
                                  HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                  BK: tl.constexpr, EVEN_K: tl.constexpr):
        # Y[M, N] = (X[M, K] @ W[N, K]^T) * S[N] (+ BIAS[N]); W int8, X/Y 16-bit, fp32 accumulation.
        # Programs for one weight tile are adjacent (row tiles vary fastest), so a tile read from
        # memory once serves the other row tiles from L2.
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BM)
        pid_m = pid % num_m
        pid_n = pid // num_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        m_ok = rm < M
        n_ok = rn < N
        # out-of-range rows/columns read row 0 (in bounds, never stored): no masks on the main loads
        rm_in = tl.where(m_ok, rm, 0).to(tl.int64)
        rn_in = tl.where(n_ok, rn, 0).to(tl.int64)
        xp = X + rm_in[:, None] * s_xm + rk[None, :]
        wp = W + rn_in[:, None] * s_wn + rk[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            if EVEN_K:
                a = tl.load(xp)
                b = tl.load(wp)
            else:
                k_ok = (k * BK + rk) < K
                a = tl.load(xp, mask=k_ok[None, :], other=0.0)
                b = tl.load(wp, mask=k_ok[None, :], other=0)
            acc += tl.dot(a, tl.trans(b.to(a.dtype)))
            xp += BK
            wp += BK
        acc = acc * tl.load(S + rn_in).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(BIAS + rn_in).to(tl.float32)[None, :]
        yp = Y + rm[:, None].to(tl.int64) * s_ym + rn[None, :]
        tl.store(yp, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    return int8_weight_linear_kernel


_triton_kernel = functools.lru_cache(maxsize=1)(_build_triton_kernel)


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Measured tiles (H100, torch 2.11, Triton 3.6: scripts/device/quant_eval.py --tune, the fastest of a
# sweep per shape, timed in CUDA graphs with the weights rotated beyond L2) for the S1-mini linears:
# (row class, N, K) -> tiles; row class "s" = up to 16 rows (timed at 2), "m" = 17..64 (timed at 64).
# Other shapes follow the rules in int8_linear_config, which give the same tiles here bar ties.
_S = {"BM": 16, "BN": 32, "BK": 256, "num_warps": 4, "num_stages": 4}
INT8_TILE_TABLE: dict[tuple[str, int, int], dict] = {
    ("s", 1024, 3072): _S, ("s", 1024, 2048): _S, ("s", 4096, 1024): _S, ("s", 3072, 1024): _S,
    ("m", 1024, 3072): {"BM": 32, "BN": 16, "BK": 256, "num_warps": 4, "num_stages": 4},
    ("m", 1024, 2048): {"BM": 32, "BN": 16, "BK": 256, "num_warps": 4, "num_stages": 4},
    ("m", 4096, 1024): {"BM": 64, "BN": 32, "BK": 256, "num_warps": 4, "num_stages": 3},
    ("m", 3072, 1024): {"BM": 64, "BN": 32, "BK": 256, "num_warps": 4, "num_stages": 4},
    ("s", 155776, 1024): {"BM": 16, "BN": 128, "BK": 256, "num_warps": 4, "num_stages": 3},
    ("m", 155776, 1024): {"BM": 64, "BN": 128, "BK": 128, "num_warps": 4, "num_stages": 3},
}


def int8_linear_config(M: int, N: int, K: int, sms: int) -> dict:
    """Tile sizes for M rows x N outputs x K inputs. Decode (M = batch rows, 2..64) is latency-bound:
    one row tile, narrow column tiles with long K steps and deep pipelining; the vocabulary-sized
    head is bandwidth-bound: wide tiles. Larger M: a plain GEMM tiling."""
    if M <= 64:
        hit = INT8_TILE_TABLE.get(("s" if M <= 16 else "m", N, K))
        if hit is not None:
            return dict(hit)
        if N >= 64 * sms:  # e.g. the 155,776-row vocabulary head
            cfg = {"BM": 16, "BN": 128, "BK": 256, "num_stages": 3} if M <= 16 else \
                {"BM": 64, "BN": 128, "BK": 128, "num_stages": 3}
        elif M <= 16:
            cfg = {"BM": 16, "BN": 32, "BK": 256, "num_stages": 4}
        elif N >= 2048:
            cfg = {"BM": 64, "BN": 32, "BK": 256, "num_stages": 3}
        else:
            cfg = {"BM": 32, "BN": 16, "BK": 256, "num_stages": 4}
    else:  # prefill-sized
        cfg = {"BM": 64, "BN": 128 if -(-N // 128) * -(-M // 64) >= sms else 64, "BK": 64, "num_stages": 3}
    cfg["BK"] = min(cfg["BK"], max(16, 1 << (max(K, 1) - 1).bit_length()))
    return {**cfg, "num_warps": 4}


def int8_linear_triton(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Tensor | None,
                       config: dict | None = None) -> Tensor:
    """The Triton kernel on x [..., K] (16-bit), weight_int8 [N, K], scale [N] -> [..., N] in x's dtype."""
    K = x.shape[-1]
    N = weight_int8.shape[0]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight_int8 if weight_int8.stride(-1) == 1 else weight_int8.contiguous()
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    if config is None:
        sms = _sm_count(x.device.index if x.device.index is not None else torch.cuda.current_device()) \
            if x.is_cuda else 132
        config = int8_linear_config(M, N, K, sms)
    cfg = dict(config)
    BM, BN, BK = cfg.pop("BM"), cfg.pop("BN"), cfg.pop("BK")
    grid = (-(-M // BM) * -(-N // BN),)
    _triton_kernel()[grid](
        x2, w, scale, bias if bias is not None else scale, y, M, N, K, x2.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BM=BM, BN=BN, BK=BK, EVEN_K=K % BK == 0, **cfg)
    return y.reshape(*x.shape[:-1], N)


# ---- choosing and applying ---------------------------------------------------------------------
def resolve_int8_kernel(requested: str | None, device: torch.device) -> str:
    """-> "fused", "dequant" or "off" for `requested` (None: auto; config passes TTS_INT8_KERNEL)."""
    kind = (requested or "auto").strip().lower()
    if kind not in INT8_KERNELS:
        raise ConfigError(f"TTS_INT8_KERNEL={kind!r} is not one of {', '.join(INT8_KERNELS)}")
    if kind == "auto":
        return "fused" if device.type == "cuda" and custom_ops_available() and triton_available() else "off"
    return kind


def _eligible(mode: str):
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
    filter_fn = _eligible(mode)
    count = sum(filter_fn(m) for m in model.modules())
    if mode == "int8":
        kernel = resolve_int8_kernel(int8_kernel, p.device)
        if kernel == "fused":
            _replace_linears(model, filter_fn, "fused")
            how = "Triton kernel" if int8_linear_op() is not None and triton_available() else "eager fallback"
            return f"int8 (built-in int8 linear, fused: {how}, {count} linear layers)"
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
