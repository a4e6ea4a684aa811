"""Copying a state dict read from disk onto the device, with the file read overlapped with the copies.

The tensors come from `torch.load(mmap=True)`: touching them is what reads the file. `Module.to(device)` copies
them one by one from pageable memory: the CPU faults the pages in, then the driver stages them, then the GPU
copies, one after the other. Here the CPU copies each 64 MiB piece into one of two pinned buffers (page faults,
so the file read, spread over torch's CPU threads) while the GPU's copy engine copies the other buffer to the
device, asynchronously. On the CPU (tests, CPU serving) nothing is staged unless asked: the tensors are
converted like Module.to would (and stay mmap-backed where no conversion is needed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..state_dict import StateDict

CHUNK_BYTES = 64 << 20


def to_device(sd: StateDict, device: torch.device | str, dtype_of: Callable[[Tensor], torch.dtype],
              staged: bool | None = None, chunk_bytes: int = CHUNK_BYTES) -> StateDict:
    """sd: CPU tensors -> the same names on `device`, each floating tensor in dtype_of(it), others as they are.
    staged: through the pinned double buffer (default: on CUDA); on the CPU it runs the same chunking with
    plain buffers (what the tests check)."""
    device = torch.device(device)
    if staged is None:
        staged = device.type == "cuda"
    if not staged:
        return {k: _cast(v.to(device), dtype_of) for k, v in sd.items()}
    return _staged_copy(sd, device, dtype_of, chunk_bytes)


def _cast(t: Tensor, dtype_of: Callable[[Tensor], torch.dtype]) -> Tensor:
    return t.to(dtype_of(t)) if t.is_floating_point() else t


def _as_bytes(t: Tensor) -> Tensor:
    # a contiguous tensor's storage bytes as uint8 [numel * element_size]
    return t.reshape(-1).view(torch.uint8)


def _staged_copy(sd: StateDict, device: torch.device, dtype_of: Callable[[Tensor], torch.dtype],
                 chunk_bytes: int) -> StateDict:
    cuda = device.type == "cuda"
    buffers = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
    done: list[torch.cuda.Event | None] = [None, None]  # each buffer's last copy to the device
    out: StateDict = {}
    n = 0
    for name, src in sd.items():
        src = src.detach().contiguous()
        dst = torch.empty(src.shape, dtype=src.dtype, device=device)
        if src.numel():
            src_bytes, dst_bytes = _as_bytes(src), _as_bytes(dst)
            for start in range(0, src_bytes.numel(), chunk_bytes):
                stop = min(start + chunk_bytes, src_bytes.numel())
                slot, n = n % 2, n + 1
                if done[slot] is not None:
                    done[slot].synchronize()  # the GPU has finished reading this buffer
                staging = buffers[slot][: stop - start]
                staging.copy_(src_bytes[start:stop])  # the file read (page faults), on torch's CPU threads
                dst_bytes[start:stop].copy_(staging, non_blocking=cuda)
                if cuda:
                    done[slot] = torch.cuda.Event()
                    done[slot].record(torch.cuda.current_stream(device))
        # converted where it now lives, right after its copies (same stream: ordered without a sync), so the
        # device holds one tensor in the file's dtype at a time, not the whole fp32 codec
        out[name] = _cast(dst, dtype_of)
    if cuda:
        torch.cuda.current_stream(device).synchronize()  # loaded means on the device (and the timings say so)
    return out
