"""A module copied to another device: one engine's weights for the next GPU, read from disk only once."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


def copy_to(module: nn.Module, device: torch.device | str) -> nn.Module:
    """A deep copy of `module` whose parameters, buffers and tensor attributes live on `device`. Each tensor
    goes straight from where it is to `device` (GPU to GPU without the host; never a second copy on the source
    device); always a new tensor, so two copies on one device share nothing."""
    device = torch.device(device)
    memo: dict[int, object] = {}
    for tensor in (*module.parameters(), *module.buffers(), *_tensor_attributes(module)):
        if id(tensor) not in memo:
            moved = tensor.detach().to(device, copy=True)
            memo[id(tensor)] = nn.Parameter(moved, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else moved
    return copy.deepcopy(module, memo)  # deepcopy looks each tensor up in memo first: the copies above are used


def _tensor_attributes(module: nn.Module) -> list[Tensor]:
    """Tensors held as plain attributes (not registered), which .parameters() and .buffers() do not list."""
    return [v for m in module.modules() for k, v in vars(m).items() if isinstance(v, Tensor) and not k.startswith("_")]
