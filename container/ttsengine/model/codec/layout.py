"""The streaming codec's two memory layouts: what differs between walking the decoder on [b, C, n] activations
and on [b, n, C] ones. The walker (streaming.py) takes the same steps on either; a layout says which axis is time
and runs the ops whose form depends on it (Snake, the convolutions, a bias's broadcast, the state's shape).

A layout with fold_biases also takes bias= on snake and conv and has conv_snake() and conv_residual(): the walker then
adds a residual unit's conv biases in the ops that read the convs' outputs (see StreamingCodec._residual_unit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .own_convs import OwnConvs


class Kernels(Protocol):
    """The walker's swappable ops, read at every call: the fused Triton ones once Vocoder.use_snake_kernel sets
    them, and the dilated convs' cuDNN tuning while Vocoder._dilated_tuned sets it."""

    snake: Callable[..., Tensor]  # (x [b, C, n], alpha, out=None)
    snake_time_major: Callable[..., Tensor]  # (x [b, n, C], alpha, out=None, bias=None)
    residual_bias: Callable[[Tensor, Tensor, Tensor], Tensor]  # (x, y, bias) -> x + (y + bias), [b, n, C]
    tune_dilated: Callable[[], contextlib.AbstractContextManager]
    own_convs: OwnConvs | None  # the time-major convs as GEMMs of our own (feature codec_own_convs), or cuDNN's


class ChannelMajor:
    """[b, C, n] activations, as the codec's modules run them; a conv's kept samples are [C, n] per row."""

    time = 2  # the time axis of an activation
    fold_biases = False  # each conv adds its own bias (folding would change the rounding)

    def __init__(self, kernels: Kernels):
        self.kernels = kernels

    def state_shape(self, channels: int, samples: int) -> tuple[int, int]:
        return channels, samples

    def from_time_major(self, h: Tensor) -> Tensor:
        return h.transpose(1, 2)  # [b, n, C] -> [b, C, n]

    to_time_major = from_time_major  # the same swap, back

    def per_channel(self, v: Tensor) -> Tensor:
        return v[:, None]  # [C] -> [C, 1], broadcast over [b, C, n]

    def snake(self, x: Tensor, alpha: Tensor, out: Tensor | None = None) -> Tensor:
        return self.kernels.snake(x, alpha, out=out)

    def conv(self, conv: nn.Conv1d, x: Tensor) -> Tensor:
        return conv(x)

    def conv_transposed(self, conv: nn.ConvTranspose1d, x: Tensor) -> Tensor:
        # [b, Ci, L] -> [b, Co, (L-1)s + k], without the bias
        return F.conv_transpose1d(x, conv.weight, None, stride=conv.stride)


class TimeMajor:
    """[b, n, C] activations, each conv a channels-last (NHWC) cuDNN convolution (TTS_CODEC_CHANNELS_LAST), or a
    GEMM of our own where the kernels give own_convs (feature codec_own_convs: no cuDNN plan per shape).

    A [b, n, C] tensor seen as [b, C, 1, n] is channels-last without a copy, so each conv runs as a channels-last
    conv2d with a (1, k) kernel and returns channels-last, which is again [b, n', C']. The channel-major layout
    hands cuDNN NCHW tensors, which it transposes to NHWC and back around every conv (a measured share of the
    codec's GPU time: docs/performance.md, "Codec"); Snake, adds and the ConvNeXt pointwise layers do not care (the
    latter even lose two transposes). Same math; convolution algorithms may differ. A conv's kept samples are
    [n, C] per row.
    """

    time = 1
    # cuDNN adds a conv's bias in a pass of its own over the output (measured costly: docs/performance.md, "Codec"):
    # the walker adds it in the Snake or residual sum that reads the output instead
    fold_biases = True

    def __init__(self, kernels: Kernels):
        self.kernels = kernels
        self._weights: dict[int, Tensor] = {}  # id(conv) -> its weight as [Co, Ci/g, 1, k] channels-last

    def state_shape(self, channels: int, samples: int) -> tuple[int, int]:
        return samples, channels

    def from_time_major(self, h: Tensor) -> Tensor:
        return h

    to_time_major = from_time_major

    def per_channel(self, v: Tensor) -> Tensor:
        return v  # [C] broadcasts over [b, n, C] as it is

    def snake(self, x: Tensor, alpha: Tensor, out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        return self.kernels.snake_time_major(x, alpha, out=out, bias=bias)

    def residual(self, x: Tensor, y: Tensor, bias: Tensor) -> Tensor:
        return self.kernels.residual_bias(x, y, bias)  # x + (y + bias)

    def conv_snake(self, conv: nn.Conv1d, x: Tensor, alpha: Tensor) -> Tensor:
        # snake(conv(x) + bias): in the conv's store with codec_fused_convs, else the conv and a Snake pass
        y = self._own("conv_snake", conv, x, alpha)
        return self.snake(self.conv(conv, x, bias=False), alpha, bias=conv.bias) if y is None else y

    def conv_residual(self, conv: nn.Conv1d, x: Tensor, residual: Tensor) -> Tensor:
        # residual + (conv(x) + bias): in the conv's store with codec_fused_convs, else the conv and a sum pass
        y = self._own("conv_residual", conv, x, residual)
        return self.residual(residual, self.conv(conv, x, bias=False), conv.bias) if y is None else y

    def conv(self, conv: nn.Conv1d, x: Tensor, bias: bool = True) -> Tensor:
        # x [b, n, Ci] -> conv(x) [b, n', Co] (bias=False: without the bias). Around the dilated convs: cuDNN's
        # untuned pick for two of them is ~35x slower than its best and is kept for the shape (Vocoder.warm_up
        # tunes just these, under its capture lock)
        y = self._own("conv", conv, x, bias)
        if y is not None:
            return y
        w, x4 = self._weight(conv), self._x4(x)
        with self.kernels.tune_dilated() if conv.dilation[0] > 1 else contextlib.nullcontext():
            y = F.conv2d(x4, w, conv.bias if bias else None, stride=(1, conv.stride[0]),
                         dilation=(1, conv.dilation[0]), groups=conv.groups)
        return y[:, :, 0].transpose(1, 2)

    def conv_transposed(self, conv: nn.ConvTranspose1d, x: Tensor) -> Tensor:
        # [b, L, Ci] -> [b, (L-1)s + k, Co], without the bias
        y = self._own("conv_transposed", conv, x)
        if y is not None:
            return y
        y = F.conv_transpose2d(self._x4(x), self._weight(conv), None, stride=(1, conv.stride[0]), groups=conv.groups)
        return y[:, :, 0].transpose(1, 2)

    def _own(self, op: str, *args) -> Tensor | None:
        """OwnConvs' `op` on args (feature codec_own_convs): None where they are off or the op is not theirs."""
        own = self.kernels.own_convs
        return None if own is None else getattr(own, op)(*args)

    @staticmethod
    def _x4(x: Tensor) -> Tensor:
        return x.transpose(1, 2)[:, :, None]  # [b, n, C] -> [b, C, 1, n], channels-last strides

    def _weight(self, conv: nn.Module) -> Tensor:
        w = self._weights.get(id(conv))
        if w is None:
            w = self._weights[id(conv)] = conv.weight.detach()[:, :, None].contiguous(memory_format=torch.channels_last)
        return w
