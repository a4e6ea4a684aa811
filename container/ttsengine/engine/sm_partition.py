"""A CUDA stream whose kernels run on a share of the GPU's SMs (a CUDA green context), for the codec.

Why: the decode step is a chain of ~1,000 small dependent kernels; the codec's convolutions are few and wide. On
one GPU they take turns more than they overlap: a step kernel queued while the codec's blocks hold every SM waits
for those blocks to drain, however high its stream's priority (priorities order the blocks not yet placed). In a
green context of N SMs the codec's kernels never hold more than those N; the step's kernels, launched from the
primary context, may use every SM (the codec's too, when it leaves room), so the step keeps its pace and the codec
runs beside it on the rest of the machine.

Green contexts share the primary context's memory: tensors, graph pools and events cross freely. CUDA graphs
captured on the stream carry its context in their kernel nodes, so replays stay inside the partition.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

CU_STREAM_NON_BLOCKING = 1


@dataclass
class Partition:
    stream: torch.cuda.Stream
    sms: int  # as asked (the driver rounds a split up to its granularity: 8 SMs on sm_90)
    context: object  # torch's GreenContext: kept alive, its destructor destroys the context and its streams

    def enter(self) -> None:
        """Makes the green context current on the calling thread (for good: the codec's worker): what the thread
        launches runs on the partition's SMs, and the cuDNN and cuBLAS handles it creates belong to the context
        (cuDNN refused a green stream with the primary context's handle: CUDNN_STATUS_NOT_SUPPORTED, H100, torch
        2.11). Streams: `stream`, not the one this leaves current (the context's legacy default, not capturable)."""
        self.context.set_context()


def partition_stream(device: torch.device, sms: int) -> Partition | None:
    """A stream of a green context of `sms` SMs on `device` -> None where the machine cannot make one (torch built
    without green contexts, a driver before CUDA 12.8, more SMs than the device has); why is logged once."""
    try:
        from torch.cuda import green_contexts
    except ImportError:
        log.warning("TTS_CODEC_SMS=%d ignored: this torch has no CUDA green contexts (torch >= 2.9)", sms)
        return None
    if not getattr(green_contexts, "SUPPORTED", False):
        log.warning("TTS_CODEC_SMS=%d ignored: this torch was built without CUDA green contexts", sms)
        return None
    total = torch.cuda.get_device_properties(device).multi_processor_count
    if sms >= total:
        log.warning("TTS_CODEC_SMS=%d ignored: %s has %d SMs; the codec shares all of them", sms, device, total)
        return None
    try:
        ctx = green_contexts.GreenContext.create(num_sms=sms, device_id=device.index)
        stream = ctx.Stream() if hasattr(ctx, "Stream") else _stream_of(ctx, device)
    except Exception as e:  # noqa: BLE001 - an unsupported driver or device: the codec shares every SM as before
        log.warning("TTS_CODEC_SMS=%d ignored: no green context on %s (%s: %s)", sms, device, type(e).__name__, e)
        return None
    log.info("codec on a green context of %d of %s's %d SMs", sms, device, total)
    return Partition(stream, sms, ctx)


def _stream_of(ctx, device: torch.device) -> torch.cuda.Stream:
    """A non-blocking stream created while the green context is current (torch before GreenContext.Stream())."""
    ctx.set_context()
    try:
        handle = ctypes.c_void_p()
        rc = ctypes.CDLL("libcuda.so.1").cuStreamCreate(ctypes.byref(handle), ctypes.c_uint(CU_STREAM_NON_BLOCKING))
        if rc != 0:
            raise RuntimeError(f"cuStreamCreate returned CUDA driver error {rc}")
    finally:
        ctx.pop_context()
    return torch.cuda.ExternalStream(handle.value, device=device)
