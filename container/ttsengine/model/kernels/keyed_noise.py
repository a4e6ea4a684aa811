"""sampling.exponential_noise inside a Triton kernel: the same counter-based hash, so a fused sampler draws the
tokens the reference draws (a row's noise depends only on its seed, its counter and the vocabulary index)."""

from __future__ import annotations

try:  # absent or broken Triton: the module still imports; the kernels that use it are then never chosen
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

if triton is not None:
    @triton.jit
    def mul32(x, c: tl.constexpr):
        # (x * c) mod 2^32 for int64 0 <= x < 2^32, in 16-bit halves as sampling._mul32 (no int64 overflow)
        return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF

    @triton.jit
    def mix32(x):
        # murmur3's finaliser, as sampling._mix32
        x = x ^ (x >> 16)
        x = mul32(x, 0x85EBCA6B)
        x = x ^ (x >> 13)
        x = mul32(x, 0xC2B2AE35)
        return x ^ (x >> 16)

    @triton.jit
    def row_key(seed_lo, seed_hi, counter):
        # int64 scalars -> the row's key (sampling.exponential_noise's `key`)
        key = mix32(seed_lo ^ 0x9E3779B9)
        key = mix32(key ^ seed_hi)
        return mix32(key ^ (counter & 0xFFFFFFFF))

    @triton.jit
    def exp_noise(key, idx):
        # the row's Exp(1) noise at vocabulary indices idx (int64): float32, never 0 or inf
        h = mix32((key + mul32(idx, 0x9E3779B9)) & 0xFFFFFFFF)
        h = mix32(h ^ 0x5BD1E995)
        u = tl.minimum((h >> 8).to(tl.float32) * (2.0 ** -24) + 2.0 ** -25, 1.0 - 2.0 ** -24)  # never 1: see there
        return -tl.log(u)
