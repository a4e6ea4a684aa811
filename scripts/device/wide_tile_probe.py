"""Why small_linear's 64-row tile was slow (2-3x its 16-row tile's time per byte, and slower at 24 rows than at 64):
plain y = x @ W.T kernels, no norm or epilogue, at 24 and 64 rows over the S1-mini decode shapes, against F.linear
(cuBLAS). Variants: (wide) one [64, BK] x tile per K step, rows past M loaded as copies of row 0 (small_linear's
way) or (masked) as zeros; (groups) four [16, BK] x tiles per K step into four accumulators, so each tl.dot is a
16-row one (mma.sync, as the 16-row tile) and the weight tile is loaded once for the four. us per call replayed in
a CUDA graph, weights rotated through more copies than L2 holds.
"wide default": the 64-row tiles small_linear had then. What it showed (H100, torch 2.11): the copies of row 0 made
24 rows 2-3x slower than masked zeros; without the norm the plain 64-row tiles were at cuBLAS's speed, so the norm
prologue (every program reading all of x) was the cost: small_linear now masks and runs that norm as a kernel first.
Usage: python3 scripts/device/wide_tile_probe.py
"""
import itertools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from graph_timing import graphed_us

SHAPES = {"slow.wqkv": (1024, 4096), "slow.wo": (2048, 1024), "slow.w13": (1024, 6144), "slow.w2": (3072, 1024),
          "fast.wo": (1024, 1024), "slow_head": (1024, 155776)}


@triton.jit(do_not_specialize=["M"])
def _wide(X, W, Y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MASKED: tl.constexpr):
    rm = tl.arange(0, BM)
    m_ok = rm < M
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    rn = tl.where(cols < N, cols, 0).to(tl.int64)
    rk = tl.arange(0, BK)
    wp = W + rn[:, None] * K + rk[None, :]
    if MASKED:
        xp = X + rm.to(tl.int64)[:, None] * K + rk[None, :]
    else:
        xp = X + tl.where(m_ok, rm, 0).to(tl.int64)[:, None] * K + rk[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        w = tl.load(wp + k0)
        if MASKED:
            x = tl.load(xp + k0, mask=m_ok[:, None], other=0.0)
        else:
            x = tl.load(xp + k0)
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(Y + rm[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=m_ok[:, None] & (cols < N)[None, :])


@triton.jit(do_not_specialize=["M"])
def _groups(X, W, Y, M, N, K, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, 16)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = cols < N
    rn = tl.where(n_ok, cols, 0).to(tl.int64)
    rk = tl.arange(0, BK)
    wp = W + rn[:, None] * K + rk[None, :]
    xp = X + rm.to(tl.int64)[:, None] * K + rk[None, :]
    a0 = tl.zeros([16, BN], dtype=tl.float32)
    a1 = tl.zeros([16, BN], dtype=tl.float32)
    a2 = tl.zeros([16, BN], dtype=tl.float32)
    a3 = tl.zeros([16, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        w = tl.trans(tl.load(wp + k0))
        a0 = tl.dot(tl.load(xp + k0, mask=(rm < M)[:, None], other=0.0), w, a0)
        a1 = tl.dot(tl.load(xp + 16 * K + k0, mask=(rm + 16 < M)[:, None], other=0.0), w, a1)
        a2 = tl.dot(tl.load(xp + 32 * K + k0, mask=(rm + 32 < M)[:, None], other=0.0), w, a2)
        a3 = tl.dot(tl.load(xp + 48 * K + k0, mask=(rm + 48 < M)[:, None], other=0.0), w, a3)
    yp = Y + rm[:, None] * N + cols[None, :]
    tl.store(yp, a0.to(tl.bfloat16), mask=(rm < M)[:, None] & n_ok[None, :])
    tl.store(yp + 16 * N, a1.to(tl.bfloat16), mask=(rm + 16 < M)[:, None] & n_ok[None, :])
    tl.store(yp + 32 * N, a2.to(tl.bfloat16), mask=(rm + 32 < M)[:, None] & n_ok[None, :])
    tl.store(yp + 48 * N, a3.to(tl.bfloat16), mask=(rm + 48 < M)[:, None] & n_ok[None, :])


def variants():
    for bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (3, 4)):
        yield ("wide", bn, bk, w, s, False)
        yield ("masked", bn, bk, w, s, True)
        yield ("groups", bn, bk, w, s, None)


def launch(v, x, w, y):
    kind, bn, bk, warps, stages, masked = v
    M, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(N, bn),)
    if kind == "groups":
        _groups[grid](x, w, y, M, N, K, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    else:
        _wide[grid](x, w, y, M, N, K, BM=64, BN=bn, BK=bk, MASKED=masked, num_warps=warps, num_stages=stages)


def main():
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| shape | rows | cuBLAS us | GB/s | wide default us | best wide | best masked | best groups |")
    for name, (K, N) in SHAPES.items():
        wbytes = N * K * 2
        copies = max(1, min(64, -(-160_000_000 // wbytes)))
        ws = [torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(K)
              for _ in range(copies)]
        for M in (24, 64):
            x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = F.linear(x, ws[0])
            y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            base = graphed_us([lambda w=w: F.linear(x, w) for w in ws])  # noqa: B023 (called here)
            best = {}
            for v in variants():
                if v[1] == 64 and N < 4096 or v[1] < 32 and N > 16384:
                    continue
                try:
                    launch(v, x, ws[0], y)
                    err = (y.float() - ref.float()).abs().max().item()
                    if err > 0.05 * ref.float().abs().max().item():
                        print(f"  {name} {v} wrong: {err}")
                        continue
                    us = graphed_us([lambda w=w: launch(v, x, w, y) for w in ws])  # noqa: B023
                except Exception as e:  # noqa: BLE001
                    print(f"  skip {v}: {str(e)[:60]}")
                    continue
                kind = v[0]
                if kind not in best or us < best[kind][0]:
                    best[kind] = (us, v)
            old = ("wide", 64 if N >= 16384 else 32 if N >= 4096 else 16, 128, 4, 3, False)  # the tiles it had
            dflt = graphed_us([lambda w=w: launch(old, x, w, y) for w in ws])  # noqa: B023 (called here)
            cell = {k: f"{u:.2f} ({v[1]}x{v[2]} w{v[3]} s{v[4]}, {wbytes / u / 1e3:,.0f} GB/s)"
                    for k, (u, v) in best.items()}
            print(f"| {name} | {M} | {base:.2f} | {wbytes / base / 1e3:,.0f} | {dflt:.2f} | {cell.get('wide')} | "
                  f"{cell.get('masked')} | {cell.get('groups')} |", flush=True)


if __name__ == "__main__":
    main()
