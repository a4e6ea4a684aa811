"""What every Triton kernel here needs from the host side: whether Triton is usable, and block sizes."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Triton imports (absent, or broken in a way that only shows on import: the reference paths)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - absent or broken: the reference path
        return False
    return True


@functools.lru_cache(maxsize=1)
def triton_major() -> int:
    """Triton's major version (0 when absent): kernels that use newer language features (tl.sort, tl.cumsum over
    a block) are chosen by default only where they were tested (3.x)."""
    if not triton_available():
        return 0
    import triton

    try:
        return int(triton.__version__.split(".")[0])
    except ValueError:
        return 0


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (tl.arange extents must be powers of two); 1 for x <= 1."""
    return 1 << max(0, (x - 1).bit_length()) if x > 1 else 1


def window_ids(previous_ids, fallback) -> tuple:
    """The samplers' penalty window as their kernels read it: (ids int64 [B, W] with unit stride along W, W); without
    a window (None) any int64 tensor (`fallback`) stands in, unread, and W is 0."""
    ids = previous_ids if previous_ids is not None else fallback
    if ids.dim() == 2 and ids.stride(1) != 1:  # the kernels walk a row's ids with stride 1
        ids = ids.contiguous()
    return ids, previous_ids.shape[1] if previous_ids is not None else 0
