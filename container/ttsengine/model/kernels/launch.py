"""Programmatic dependent launch (PDL): where the decode step's Triton kernels may overlap their predecessor.

At one or two rows the step is a chain of ~500 small kernels, each a few microseconds of which the launch and the
first weight bytes' latency are a large part. With PDL (sm_90+, CUDA graphs keep it) a kernel is launched while the
previous one still runs; it loads what no kernel writes (its weights), then waits at `gdc_wait` until the previous
kernel has finished and its writes are visible, and only then reads activations and writes anything. A kernel
launched this way must wait before every dependent read and every write, on every path: the contract of every
kernel that takes a PDL flag here.

Also here: a launch the GPU refuses for want of shared memory retried with fewer pipeline stages (launch_fitting).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from .triton_support import triton_available

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def gdc_ops() -> tuple:
    """(gdc_wait, gdc_launch_dependents) from Triton, or (None, None) where this Triton has no grid dependency
    control (triton.language.extra.cuda.gdc_wait: Triton 3.6 has it, 2.x does not; the kernels then never take the
    PDL path)."""
    if not triton_available():
        return None, None
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:
        return None, None
    return gdc_wait, gdc_launch_dependents


MIN_DRIVER = 12030  # CUDA 12.3: programmatic dependencies kept by stream capture (the decode step is a CUDA graph)


@functools.lru_cache(maxsize=8)
def _capable(index: int) -> bool:
    if torch.version.hip is not None:  # ROCm reports its own (9, x) capabilities; no grid dependency control there
        return False
    return driver_version() >= MIN_DRIVER and torch.cuda.get_device_capability(index) >= (9, 0)


@functools.lru_cache(maxsize=1)
def driver_version() -> int:
    """The CUDA driver's version (12030 for 12.3) from libcuda itself, 0 where it cannot be read (then no PDL)."""
    import ctypes

    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return version.value


def pdl_runs(device: torch.device) -> bool:
    """Whether a kernel on `device` can be launched as a programmatic dependent: NVIDIA sm_90+ with a CUDA 12.3+
    driver and a Triton that has grid dependency control, and not Triton's interpreter (no such instructions)."""
    if device.type != "cuda" or gdc_ops()[0] is None:
        return False
    from .small_linear import _interpreted

    return not _interpreted() and _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(pdl: bool, device: torch.device) -> dict:
    """The keyword arguments a kernel taking a PDL flag is launched with: its `PDL` constexpr and, where a
    programmatic dependent launch runs (pdl_runs), Triton's `launch_pdl`. pdl False: launched as usual."""
    if pdl and pdl_runs(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


_STAGES: dict[tuple, int] = {}  # a launch's key -> the pipeline stages this GPU's shared memory holds for it


def launch_fitting(launch: Callable[[int], object], key: tuple, stages: int) -> int:
    """launch(stages), or with the most stages below that the GPU takes: tiles tuned on GPUs with 227 KB of shared
    memory a program may not fit GPUs with less (99 KB: L40S, A10, L4, RTX), where Triton refuses them with
    OutOfResources before anything runs (e.g. small_linear's 64-row tile, 4 stages of 40 KB). A key keeps the
    count that launched (one per GPU and variant, so a row's bits still do not depend on the batch; stages move
    when loads are issued, not the order of the sums). -> the stages used."""
    n = _STAGES.get(key, stages)
    while True:
        try:
            launch(n)
        except _out_of_resources() as e:
            if n <= 1:
                raise
            n -= 1
            log.info("Triton launch refused: %s; retrying with %d pipeline stages", e, n)
            continue
        _STAGES[key] = n
        return n


@functools.lru_cache(maxsize=1)
def _out_of_resources() -> type[Exception]:
    """Triton's launch-time refusal (OutOfResources), or an exception nothing raises where Triton has none."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:
        return _NeverRaised
    return OutOfResources


class _NeverRaised(Exception):
    pass
