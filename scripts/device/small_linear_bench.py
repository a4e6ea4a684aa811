"""small_linear (model/kernels/small_linear.py) against the eager ops it fuses, per S1-mini decode-step linear and 1-16
rows (--rows up to 64: above 16 the kernel's 64-row tile, TTS_LAYER_GEMV_ROWS, its norm a kernel first): us per call
replayed in a CUDA graph (launch costs as in the engine; weights rotated through more copies than L2 holds) and GB/s
of weight bytes, for (a) the unfused ops (rms_norm, F.linear or the engine's int8 linear, residual add or silu *
mul), (b) small_linear's default tiles, (c) the best of a small sweep. Each config is first checked against
small_linear_reference (the bf16 bound of tests/model/test_small_linear.py). Per shape, last: the config fastest over
each class of rows (a row's bits follow its config, so the default must be one config for every M of a class).
Usage: PYTHONPATH=container python3 scripts/device/small_linear_bench.py [--int8] [--budget S] [SHAPE ...]
"""
import argparse
import itertools
import math
import time

import torch
import torch.nn.functional as F
from graph_timing import graphed_us  # scripts/device/graph_timing.py

from ttsengine.model.kernels.small_linear import (
    CORE_ROWS,
    TILE_ROWS,
    SmallLinearConfig,
    small_linear,
    small_linear_config,
)
from ttsengine.model.kernels.small_linear import small_linear_reference as reference
from ttsengine.model.layers import rms_norm
from ttsengine.model.quant import int8_linear

SHAPES = {  # name: K, N (weight rows), RMSNorm prologue, epilogue, out_rows
    "slow.wqkv": (1024, 4096, True, "none", None), "slow.wo": (2048, 1024, False, "residual", None),
    "slow.w13": (1024, 6144, True, "swiglu", None), "slow.w2": (3072, 1024, False, "residual", None),
    "fast.wqkv": (1024, 2048, True, "none", None), "fast.wo": (1024, 1024, False, "residual", None),
    "fast.w13": (1024, 6144, True, "swiglu", None), "fast.w2": (3072, 1024, False, "residual", None),
    "fast_head": (1024, 4096, True, "none", 1024), "slow_head": (1024, 155776, True, "none", None),
}
ROWS = (1, 2, 4, 8, 16)
EPS = 1e-6
DEV = "cuda"


def sweep():
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3, 4)):
        yield SmallLinearConfig(bn, bk, warps, stages, use_dot=True)
    for bn, bk, warps in itertools.product((2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8)):
        yield SmallLinearConfig(bn, bk, warps, 2, use_dot=False)


def fmt(c: SmallLinearConfig) -> str:
    return f"{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} {'dot' if c.use_dot else 'cores'}"


def unfused(x, w, kw):
    """The eager path: each op its own kernel(s)."""
    rows = kw["out_rows"] or w.shape[0]
    h = x if kw["norm_weight"] is None else rms_norm(x, kw["norm_weight"], EPS)
    y = F.linear(h, w[:rows]) if kw["scale"] is None else int8_linear(h, w[:rows], kw["scale"][:rows], None)
    if kw["swiglu"]:
        a, b = y.chunk(2, dim=-1)
        return F.silu(a) * b
    return y if kw["residual"] is None else kw["residual"] + y


def close_enough(got, x, w, kw) -> bool:
    # the test's bound: 3 bf16 ulps of max(|out|, |x @ W.T|), with cuBLAS reducing in fp32
    m = torch.backends.cuda.matmul
    old, m.allow_bf16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction, False
    want = reference(x, w, **kw)
    y = reference(x, w, scale=kw["scale"], norm_weight=kw["norm_weight"], eps=EPS, out_rows=kw["out_rows"])
    m.allow_bf16_reduced_precision_reduction = old
    mag = max(want.float().abs().max().item(), y.float().abs().max().item(), 1e-30)
    return (got.float() - want.float()).abs().max().item() <= 3 * 2.0 ** (math.floor(math.log2(mag)) - 7)


def timed(cfg, x, ws, kws, checked: dict) -> float:
    """us per small_linear call with tiles `cfg` (inf if it failed its check, once per shape, or the launch)."""
    try:
        if cfg not in checked:
            checked[cfg] = close_enough(small_linear(x, ws[0], config=cfg, **kws[0]), x, ws[0], kws[0])
        if not checked[cfg]:
            return math.inf
        return graphed_us([lambda w=w, kw=kw: small_linear(x, w, config=cfg, **kw) for w, kw in zip(ws, kws)])
    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
        print(f"  skip {fmt(cfg)}: {str(e)[:80]}", flush=True)
        checked[cfg] = False
        return math.inf


def row_class(M: int) -> str:
    """The rows that share one default config (a row's bits follow its config): 1-2 and 3-16 (16-row tile), 17-64."""
    return "1-2" if M <= CORE_ROWS else "3-16" if M <= TILE_ROWS else "17-64"


def bench_shape(name: str, int8: bool, deadline: float, g: torch.Generator) -> None:
    K, N, norm, epilogue, out_rows = SHAPES[name]
    n_out = N // 2 if epilogue == "swiglu" else (out_rows or N)
    wbytes = (out_rows or N) * K * (1 if int8 else 2)
    copies = max(1, min(64, -(-160_000_000 // wbytes)))  # more than L2: every layer's weights differ
    ws, scales = [], []
    for _ in range(copies):
        w = torch.randn(N, K, generator=g) / math.sqrt(K)
        s = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        ws.append(torch.round(w / s[:, None]).to(DEV, torch.int8) if int8 else w.to(DEV, torch.bfloat16))
        scales.append(s.to(DEV) if int8 else None)
    nw = (1 + 0.2 * torch.randn(K, generator=g)).to(DEV, torch.bfloat16) if norm else None
    print(f"\n### {name}: K={K} N={N}{f' (first {out_rows})' if out_rows else ''} norm={norm} epilogue={epilogue}, "
          f"{copies} weight copies, default (rows 1 / 16 / 64) "
          + " / ".join(fmt(small_linear_config(n_out, K, torch.bfloat16, epilogue == 'swiglu', m, norm))
                       for m in (1, 16, 64)), flush=True)
    print("| rows | torch us | GB/s | small_linear us | GB/s | best us | GB/s | best config |", flush=True)
    totals, checks = {}, {}  # totals: (class of M, config) -> us at each M of the class; checks: per class
    for M in ROWS:
        checked = checks.setdefault(row_class(M), {})  # a config's check holds for its class (the tile's rows)
        x = (torch.randn(M, K, generator=g) * 2).to(DEV, torch.bfloat16)
        default = small_linear_config(n_out, K, torch.bfloat16, epilogue == "swiglu", M, norm)
        res = torch.randn(M, n_out, generator=g).to(DEV, torch.bfloat16) if epilogue == "residual" else None
        kws = [{"scale": s, "norm_weight": nw, "eps": EPS, "residual": res, "swiglu": epilogue == "swiglu",
                "out_rows": out_rows} for s in scales]
        with torch.inference_mode():
            base = graphed_us([lambda w=w, kw=kw: unfused(x, w, kw) for w, kw in zip(ws, kws)])  # noqa: B023
            mine = timed(default, x, ws, kws, checked)
            assert checked[default], f"{name}: small_linear differs from its reference"
            best = (mine, default)
            for cfg in sweep():
                if time.perf_counter() > deadline:
                    break
                us = timed(cfg, x, ws, kws, checked)
                totals.setdefault((row_class(M), cfg), []).append(us)
                best = min(best, (us, cfg), key=lambda b: b[0])
        gbs = [wbytes / us / 1e3 for us in (base, mine, best[0])]
        print(f"| {M} | {base:.2f} | {gbs[0]:,.0f} | {mine:.2f} | {gbs[1]:,.0f} | {best[0]:.2f} | {gbs[2]:,.0f} "
              f"| {fmt(best[1])} |", flush=True)
    for cls in sorted({row_class(M) for M in ROWS}):
        n = sum(row_class(M) == cls for M in ROWS)
        full = {cfg: sum(t) for (c, cfg), t in totals.items() if c == cls and len(t) == n}  # timed at each M
        if full:
            cfg = min(full, key=full.get)
            print(f"best over rows {cls}: {fmt(cfg)} ({full[cfg] / n:.2f} us mean)", flush=True)


def main():
    global ROWS
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all sweeps (then defaults only)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, e.g. 1,2")
    args = ap.parse_args()
    ROWS = tuple(int(r) for r in args.rows.split(","))
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | {'int8' if args.int8 else 'bf16'} weights",
          flush=True)
    deadline = time.perf_counter() + args.budget
    g = torch.Generator().manual_seed(0)
    for name in args.shapes:
        bench_shape(name, args.int8, deadline, g)


if __name__ == "__main__":
    main()
