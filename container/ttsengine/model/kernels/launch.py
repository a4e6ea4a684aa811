"""Programmatic dependent launch (PDL): where the decode step's Triton kernels may overlap their predecessor.

At one or two rows the step is a chain of ~500 small kernels, each a few microseconds of which the launch and the
first weight bytes' latency are a large part. With PDL (sm_90+, CUDA graphs keep it) a kernel is launched while the
previous one still runs; it loads what no kernel writes (its weights), then waits at `gdc_wait` until the previous
kernel has finished and its writes are visible, and only then reads activations and writes anything. A kernel
launched this way must wait before every dependent read and every write, on every path: the contract of every
kernel that takes a PDL flag here.
"""

from __future__ import annotations

import functools

import torch

from .triton_support import triton_available


@functools.lru_cache(maxsize=1)
def gdc_ops() -> tuple:
    """(gdc_wait, gdc_launch_dependents) from Triton, or (None, None) where this Triton has no grid dependency
    control (before 3.3: its kernels then never take the PDL path)."""
    if not triton_available():
        return None, None
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:
        return None, None
    return gdc_wait, gdc_launch_dependents


@functools.lru_cache(maxsize=8)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_runs(device: torch.device) -> bool:
    """Whether a kernel on `device` can be launched as a programmatic dependent: CUDA sm_90+ with a Triton that has
    grid dependency control, and not Triton's interpreter (which has no such instructions)."""
    if device.type != "cuda" or gdc_ops()[0] is None:
        return False
    from .small_linear import _interpreted

    return not _interpreted() and _capable(device.index if device.index is not None else torch.cuda.current_device())
