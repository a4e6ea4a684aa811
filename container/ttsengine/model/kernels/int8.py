"""The fused int8 weight-only linear on Triton, Y = (X @ W_int8^T) * scale (+ bias): which kernel and
tiles, and the launch. The kernels themselves are in int8_jit.py (loaded on first use).

Two kernels, picked per call by `int8_linear_config`:
- `tile`: a tl.dot tiling (int8 tile converted in registers, tensor cores, scale and bias in the
  epilogue). Used from 3 rows up, and for the vocabulary-sized head at any row count.
- `gemv`: for 1-2 rows (one or two streams' decode step, buckets 1 and 2). No tensor cores: each program owns
  4 output columns and the whole K, multiplies in fp32 on CUDA cores and reduces once at the end. A
  tl.dot needs >= 16 columns per program, which on a 1,024-column layer leaves 64 programs for 132
  SMs; 4 columns give 256 programs reading the weight at full bandwidth.

At 2 rows the GEMV kernel measured faster than cuBLAS bf16 and the tiles on every decode-layer linear, and the
step at bucket 2 faster with it (docs/performance.md, "int8 linears"). The per-linear sweep is
`scripts/device/quant_eval.py --micro`; the step times `quant_eval.py bf16 int8 int8:tile`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .triton_support import next_pow2

GEMV_MAX_ROWS = 2  # measured at 2 rows only; from 3 rows the tl.dot tiles (tuned at 2 and 64) are used


@functools.lru_cache(maxsize=1)
def _kernels():
    """-> (tile, gemv) jitted kernels, imported on first use so that importing this module needs no Triton."""
    from . import int8_jit

    return int8_jit.tile_kernel, int8_jit.gemv_kernel


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Measured tiles (scripts/device/quant_eval.py --tune, the fastest of a sweep per shape, timed in CUDA graphs
# with the weights rotated beyond L2; docs/performance.md, "int8 linears") for the S1-mini linears:
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


def gemv_config(K: int) -> dict:
    """The gemv kernel's tiles (the probe's sweep at 2 rows over BN 4..64, BK 128..1024, warps 2..8:
    4 columns and BK 1024 won on every S1-mini shape; long K preferred the 3-D accumulator)."""
    long_k = K > 1024
    return {"kernel": "gemv", "BN": 4, "BK": min(1024, max(16, next_pow2(K))), "ACC3": long_k,
            "num_warps": 4 if long_k else 2, "num_stages": 2}


def int8_linear_config(M: int, N: int, K: int, sms: int, gemv_rows: int = GEMV_MAX_ROWS) -> dict:
    """Kernel and tiles for M rows x N outputs x K inputs. Up to `gemv_rows` rows (0: never) the gemv
    kernel, except on the bandwidth-bound vocabulary-sized head where wide tl.dot tiles read faster.
    Decode (M = batch rows, 2..64) is latency-bound: one row tile, narrow column tiles with long K
    steps and deep pipelining; the vocabulary head: wide tiles. Larger M: a plain GEMM tiling."""
    wide = N >= 64 * sms  # e.g. the 155,776-row vocabulary head
    if M <= gemv_rows and not wide:
        return gemv_config(K)
    if M <= 64:
        hit = INT8_TILE_TABLE.get(("s" if M <= 16 else "m", N, K))
        if hit is not None:
            return {"kernel": "tile", **hit}
        if wide:
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
    cfg["BK"] = min(cfg["BK"], max(16, next_pow2(K)))
    return {"kernel": "tile", **cfg, "num_warps": 4}


def int8_linear_triton(x: Tensor, weight_int8: Tensor, scale: Tensor, bias: Tensor | None,
                       config: dict | None = None, gemv_rows: int = GEMV_MAX_ROWS) -> Tensor:
    """x [..., K] (16-bit), weight_int8 [N, K], scale [N] -> [..., N] in x's dtype. `config`: a dict
    from int8_linear_config (None: chosen here; a dict without "kernel" means the tile kernel)."""
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
        config = int8_linear_config(M, N, K, sms, gemv_rows)
    cfg = dict(config)
    kind = cfg.pop("kernel", "tile")
    BN, BK = cfg.pop("BN"), cfg.pop("BK")
    args = (x2, w, scale, bias if bias is not None else scale, y, M, N, K, x2.stride(0), w.stride(0), y.stride(0))
    tile, gemv = _kernels()
    if kind == "gemv":
        gemv[(-(-N // BN),)](*args, HAS_BIAS=bias is not None, BM=max(2, next_pow2(M)), BN=BN, BK=BK,
                             EVEN_K=K % BK == 0, ACC3=cfg.pop("ACC3"), **cfg)
    else:
        BM = cfg.pop("BM")
        tile[(-(-M // BM) * -(-N // BN),)](*args, HAS_BIAS=bias is not None, BM=BM, BN=BN, BK=BK,
                                           EVEN_K=K % BK == 0, **cfg)
    return y.reshape(*x.shape[:-1], N)
