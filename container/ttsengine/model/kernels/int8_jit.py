"""The Triton kernels of the fused int8 weight-only linear (host side, tiles and choice: int8.py).

Imported only where Triton is installed: int8.py loads this module on the first kernel launch.
"""

import triton
import triton.language as tl


# Both kernels: Y[M, N] = (X[M, K] @ W[N, K]^T) * S[N] (+ BIAS[N]); W int8, X/Y 16-bit, fp32
# accumulation. The helpers below are inlined into each kernel by Triton.
@triton.jit
def start_pointers(X, W, rm, rn, rk, M, N, s_xm, s_wn):
    # out-of-range rows/columns read row 0 (in bounds, never stored): no masks on the main loads
    m_ok = rm < M
    n_ok = rn < N
    rn_in = tl.where(n_ok, rn, 0).to(tl.int64)
    xp = X + tl.where(m_ok, rm, 0).to(tl.int64)[:, None] * s_xm + rk[None, :]
    wp = W + rn_in[:, None] * s_wn + rk[None, :]
    return xp, wp, rn_in, m_ok, n_ok


@triton.jit
def load_k_step(xp, wp, k, rk, K, BK: tl.constexpr, EVEN_K: tl.constexpr):
    # -> x [rows, BK] and w [columns, BK] of K step k (zeros past K)
    if EVEN_K:
        a = tl.load(xp)
        b = tl.load(wp)
    else:
        k_ok = (k * BK + rk) < K
        a = tl.load(xp, mask=k_ok[None, :], other=0.0)
        b = tl.load(wp, mask=k_ok[None, :], other=0)
    return a, b


@triton.jit
def store_scaled(acc, S, BIAS, Y, rm, rn, rn_in, m_ok, n_ok, s_ym, HAS_BIAS: tl.constexpr):
    # acc [rows, columns] fp32 -> Y, per-column scale and bias in fp32
    acc = acc * tl.load(S + rn_in).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + rn_in).to(tl.float32)[None, :]
    yp = Y + rm[:, None].to(tl.int64) * s_ym + rn[None, :]
    tl.store(yp, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["M"])
def tile_kernel(X, W, S, BIAS, Y, M, N, K, s_xm, s_wn, s_ym,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, EVEN_K: tl.constexpr):
    # tensor-core tiles. Programs for one weight tile are adjacent (row tiles vary fastest), so a
    # tile read from memory once serves the other row tiles from L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    rm = (pid % num_m) * BM + tl.arange(0, BM)
    rn = (pid // num_m) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    xp, wp, rn_in, m_ok, n_ok = start_pointers(X, W, rm, rn, rk, M, N, s_xm, s_wn)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a, b = load_k_step(xp, wp, k, rk, K, BK, EVEN_K)
        acc += tl.dot(a, tl.trans(b.to(a.dtype)))
        xp += BK
        wp += BK
    store_scaled(acc, S, BIAS, Y, rm, rn, rn_in, m_ok, n_ok, s_ym, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def gemv_kernel(X, W, S, BIAS, Y, M, N, K, s_xm, s_wn, s_ym,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, EVEN_K: tl.constexpr, ACC3: tl.constexpr):
    # M <= BM rows on CUDA cores. One program: all rows x BN columns x all K. ACC3 keeps
    # [BM, BN, BK] partial products in registers and reduces over K once at the end (faster for
    # long K); otherwise each K step is reduced as it comes.
    rm = tl.arange(0, BM)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    xp, wp, rn_in, m_ok, n_ok = start_pointers(X, W, rm, rn, rk, M, N, s_xm, s_wn)
    if ACC3:
        acc3 = tl.zeros((BM, BN, BK), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a, b = load_k_step(xp, wp, k, rk, K, BK, EVEN_K)
        prod = a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]  # [BM, BN, BK]
        if ACC3:
            acc3 += prod
        else:
            acc += tl.sum(prod, axis=2)
        xp += BK
        wp += BK
    if ACC3:
        acc = tl.sum(acc3, axis=2)
    store_scaled(acc, S, BIAS, Y, rm, rn, rn_in, m_ok, n_ok, s_ym, HAS_BIAS)
