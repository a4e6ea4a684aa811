"""Causal convolution blocks of the modded DAC codec (S1 spec §7.1). Weight norm is folded into plain
weights at load time (model/state_dict.py), so these hold ordinary conv weights.

Tensors are [B, C, L] throughout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def snake(x: Tensor, alpha: Tensor, out: Tensor | None = None) -> Tensor:
    # x: [B, C, L], alpha: [1, C, 1]; out: where to write the result (e.g. a wider buffer's tail), else a new tensor
    y = x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
    return y if out is None else out.copy_(y)


def snake_time_major(x: Tensor, alpha: Tensor, out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    # snake on x (+ bias [C]: the preceding conv's, added here instead of in a pass of its own): x [B, L, C]
    # (alpha [1, C, 1] as the module holds it)
    return snake(x if bias is None else x + bias, alpha.reshape(1, 1, -1), out)


def residual_bias(x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
    # x + (y + bias): a residual unit's skip sum with its last conv's bias [C] folded in; x, y [B, L, C]
    return x + (y + bias)


class Snake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return snake(x, self.alpha)


class CausalConv(nn.Module):
    """Conv1d padded on the left by K - stride (K the dilated kernel) and on the right just enough to
    cover the last window; output length L / stride for L divisible by stride."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.left = self.span - stride  # the history a streaming decoder must keep

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.span + self.left) / self.stride + 1)
        right = (frames - 1) * self.stride + (self.span - self.left) - length
        return self.conv(F.pad(x, (self.left, right)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d without padding, then the last kernel - stride samples dropped: length L * stride."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim else y


class ResidualUnit(nn.Module):
    """x + conv1(snake(conv7_dilated(snake(x)))); lengths are equal because the convs are causal."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels), CausalConv(channels, channels, 7, dilation=dilation),
            Snake(channels), CausalConv(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class ConvNeXtBlock(nn.Module):
    """x + gamma * pw2(gelu(pw1(LayerNorm(causal depthwise conv7(x))))), channels-last in the middle."""

    def __init__(self, dim: int, kernel: int = 7, mlp_ratio: float = 4.0):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, kernel, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, int(mlp_ratio * dim))
        self.pwconv2 = nn.Linear(int(mlp_ratio * dim), dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pointwise(self.dwconv(x))

    def pointwise(self, y: Tensor) -> Tensor:
        # y: [B, C, L], the depthwise conv's output -> the residual branch [B, C, L]
        return self.pointwise_time_major(y.transpose(1, 2)).transpose(1, 2)

    def pointwise_time_major(self, y: Tensor) -> Tensor:
        # pointwise on [B, L, C] (the layers' own layout: the streaming codec calls it directly, either layout)
        return self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
