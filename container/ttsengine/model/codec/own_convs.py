"""The time-major codec's convolutions without cuDNN (feature codec_own_convs): each a GEMM of our own or cuBLAS's.

Why: cuDNN builds a plan for every new conv shape (and, tuned, times its algorithms): the largest part of a settled
start is that work for each of the codec's CUDA graphs (docs/performance.md, "Codec"); GEMMs need none. Per conv:
- dense, kernel k > 1 (the residual units' dilated 7-tap convs, the first and last conv): the Triton implicit GEMM
  (model/kernels/codec/conv.py) on CUDA; elsewhere (and as the reference) the same sum as one GEMM over the
  unfolded taps;
- 1-tap: a linear layer (cuBLAS);
- depthwise (the upsampler's ConvNeXt blocks, a few positions a frame): the taps summed in fp32, one multiply-add
  per tap (a [b, n, C, k] fp32 product cost 5x cuDNN's time);
- transposed, kernel k = m x stride s (the upsampling convs): on CUDA the same Triton kernel, as an m-tap conv
  from Ci to s x Co over the input with m - 1 zeros each side (each output position's s samples are the sum of m
  input positions' products, accumulated in fp32 in the kernel); elsewhere one GEMM to every tap's output, then
  the taps' overlap added in fp32.
Anything else (grouped but not depthwise, strided) returns None: the layout runs it through cuDNN as before.
With fused (feature codec_fused_convs, CUDA), a residual unit's dilated conv stores Snake of its output and its 1-tap
conv stores the residual sum (conv_snake, conv_residual: the kernel's epilogues), two passes over the activations
fewer per unit; elsewhere those return None and the layout runs the ops one by one.
Activations are [b, n, C]; outputs are new tensors the walker may change.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class OwnConvs:
    def __init__(self, kernel: bool, fused: bool = False):
        """kernel: dense convs on CUDA through the Triton kernel (else the unfolded GEMM everywhere); fused: the
        residual units' epilogues in that kernel too."""
        self.kernel, self.fused = kernel, fused
        self._weights: dict[tuple, Tensor] = {}  # (id(conv), form) -> its weight in the form a GEMM reads

    def conv(self, conv: nn.Conv1d, x: Tensor, bias: bool = True) -> Tensor | None:
        """x [b, n, Ci] -> [b, n - (k-1) d, Co] (bias=False: without the conv's bias); None: not ours."""
        (k,), (d,), (s,) = conv.kernel_size, conv.dilation, conv.stride
        b = conv.bias if bias else None
        if s != 1 or conv.padding != (0,):
            return None
        co, ci_g, _ = conv.weight.shape
        if conv.groups == 1 and k == 1:
            return F.linear(x, self._weight(conv, _one_tap), b)
        if conv.groups == 1:
            if self.kernel and x.is_cuda:
                return self._kernel_conv(conv, x, b)
            return F.linear(taps(x, k, d).flatten(2), self._weight(conv, _unfolded), b)
        if conv.groups == co and ci_g == 1:  # depthwise: y[:, t] = sum_j x[:, t + j d] * w[j], per channel
            w = self._weight(conv, _depthwise)  # [k, C]
            n_out = x.shape[1] - (k - 1) * d
            y = x.new_zeros(x.shape[0], n_out, co, dtype=torch.float32)
            if b is not None:
                y += b.float()
            for j in range(k):
                y.addcmul_(x[:, j * d:j * d + n_out], w[j])
            return y.to(x.dtype)
        return None

    def conv_snake(self, conv: nn.Conv1d, x: Tensor, alpha: Tensor) -> Tensor | None:
        """snake(conv(x) + bias, alpha) in the conv's store, x [b, n, Ci]; None: not fused here."""
        return self._fused(conv, x, snake_alpha=alpha)

    def conv_residual(self, conv: nn.Conv1d, x: Tensor, residual: Tensor) -> Tensor | None:
        """residual + (conv(x) + bias) in the conv's store, x [b, n, Ci], residual [b, n', Co]; None: not fused."""
        return self._fused(conv, x, residual=residual)

    def _fused(self, conv: nn.Conv1d, x: Tensor, **epilogue) -> Tensor | None:
        if not (self.fused and self.kernel and x.is_cuda) or conv.groups != 1 or conv.stride != (1,) \
                or conv.padding != (0,):
            return None
        return self._kernel_conv(conv, x, conv.bias, **epilogue)

    def _kernel_conv(self, conv: nn.Conv1d, x: Tensor, bias: Tensor | None, **kw) -> Tensor:
        """A dense stride-1 conv through the Triton kernel (CUDA), kw its epilogue."""
        from ..kernels.codec.conv import conv_time_major

        x = x if x.stride(2) == 1 or x.shape[2] == 1 else x.contiguous()
        return conv_time_major(x, self._weight(conv, _taps_major), conv.dilation[0], bias, **kw)

    def conv_transposed(self, conv: nn.ConvTranspose1d, x: Tensor) -> Tensor | None:
        """x [b, L, Ci] -> [b, (L-1) s + k, Co] without the bias; None: not ours."""
        (k,), (s,) = conv.kernel_size, conv.stride
        if conv.groups != 1 or k % s or conv.padding != (0,) or conv.output_padding != (0,) or conv.dilation != (1,):
            return None
        batch, length, ci = x.shape
        co, m = conv.weight.shape[1], k // s
        if self.kernel and x.is_cuda and m > 1:
            from ..kernels.codec.conv import conv_time_major

            x = x if x.stride(2) == 1 else x.contiguous()
            w = self._weight(conv, transposed_as_conv)
            return conv_time_major(x, w, 1, pad=m - 1).view(batch, (length + m - 1) * s, co)
        # every input position's k output samples: [b, L, k * Co] -> [b, L, m, s, Co]
        taps_out = F.linear(x, self._weight(conv, _every_tap)).view(batch, length, m, s, co)
        if m == 1:  # no overlap (the quantizer's upsampling: kernel = stride)
            return taps_out.view(batch, length * s, co)
        # the overlapping taps summed in fp32 and rounded once, as a convolution's accumulator does
        y = taps_out.new_zeros(batch, length + m - 1, s, co, dtype=torch.float32)
        for q in range(m):  # input position t's q-th stride of samples lands at output stride t + q
            y[:, q:q + length] += taps_out[:, :, q]
        return y.view(batch, (length + m - 1) * s, co).to(x.dtype)

    def _weight(self, conv: nn.Module, form) -> Tensor:
        """conv's weight as form(conv) gives it, made once (form: one of the functions below, a stable cache key: a
        1-tap conv's weight is read as [Co, Ci] by F.linear and as [1, Ci, Co] by the fused kernel)."""
        key = (id(conv), form)
        w = self._weights.get(key)
        if w is None:
            w = self._weights[key] = form(conv).detach().contiguous()
        return w


def _one_tap(conv: nn.Conv1d) -> Tensor:
    return conv.weight[:, :, 0]  # [Co, Ci]: F.linear's


def _taps_major(conv: nn.Conv1d) -> Tensor:
    return conv.weight.permute(2, 1, 0)  # [k, Ci, Co]: the kernel's


def _unfolded(conv: nn.Conv1d) -> Tensor:
    return conv.weight.permute(0, 2, 1).flatten(1)  # [Co, k Ci]: F.linear over the unfolded taps


def _depthwise(conv: nn.Conv1d) -> Tensor:
    return conv.weight[:, 0].t().float()  # [k, C]


def _every_tap(conv: nn.ConvTranspose1d) -> Tensor:
    return conv.weight.permute(2, 1, 0).flatten(0, 1)  # [k Co, Ci]: one GEMM to every tap's output


def transposed_as_conv(conv: nn.ConvTranspose1d) -> Tensor:
    """transposed_weight_as_conv of conv's weight and stride."""
    return transposed_weight_as_conv(conv.weight, conv.stride[0])


def transposed_weight_as_conv(weight: Tensor, s: int) -> Tensor:
    """A transposed conv's weight [Ci, Co, k = m s] -> the m-tap conv's [m, Ci, s Co] that gives its output: output
    stride t's s samples = sum over q < m of input t - q times tap q (tap q's samples r: weight[..., q s + r]); a conv
    reads input t + j for tap j over m - 1 leading zeros, so its tap j is the transposed conv's tap m - 1 - j."""
    ci, co, k = weight.shape
    return weight.reshape(ci, co, k // s, s).permute(2, 0, 3, 1).flip(0).reshape(k // s, ci, s * co)


def taps(x: Tensor, k: int, d: int) -> Tensor:
    """x [b, n, C] -> its k taps of dilation d, [b, n - (k-1) d, k, C] (a view where x's strides allow)."""
    span = (k - 1) * d + 1
    return x.unfold(1, span, 1)[..., ::d].transpose(2, 3)  # [b, n', C, span] -> [b, n', k, C]
