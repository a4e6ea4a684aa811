"""The codec's convolutions as GEMMs of our own (model/codec/own_convs.py, feature codec_own_convs) equal cuDNN's /
PyTorch's convolutions (fp32 on CPU: summation order only), each kind the codec has, from views of wider buffers as the
walker hands them; the streaming codec with them equals the whole decode. The Triton kernel itself runs in Triton
>= 3's interpreter on CPU-only machines (conftest.py sets TRITON_INTERPRET=1; CI's current lane has Triton), natively
on a GPU: tests/engine/test_gpu.py."""

from __future__ import annotations

import os

import pytest
import torch
from test_codec_streaming import TOL, random_codes
from torch import nn
from torch.nn import functional as F

from ttsengine.model.codec.own_convs import OwnConvs, transposed_weight_as_conv
from ttsengine.model.codec.streaming import StreamingCodec
from ttsengine.model.kernels.triton_support import triton_major

CONVS = [  # (c_in, c_out, kernel, dilation, groups): the codec's kinds
    (48, 40, 7, 3, 1), (96, 1, 7, 1, 1), (64, 64, 7, 9, 1), (32, 48, 1, 1, 1), (24, 24, 7, 1, 24), (16, 16, 3, 2, 16)]


def _time_major(conv: nn.Conv1d, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
    return F.conv1d(x.transpose(1, 2), conv.weight, conv.bias if bias else None,
                    dilation=conv.dilation, groups=conv.groups).transpose(1, 2)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", CONVS, ids=[f"{c[0]}-{c[1]}-k{c[2]}-d{c[3]}-g{c[4]}" for c in CONVS])
def test_conv_equals_torch(shape, bias):
    ci, co, k, d, g = shape
    torch.manual_seed(sum(shape))
    conv = nn.Conv1d(ci, co, k, dilation=d, groups=g)
    buf = torch.randn(3, 5 + 11 + (k - 1) * d, ci)
    x = buf[:, 5:]  # a view with a wider buffer's strides, as _snake_behind hands it
    with torch.inference_mode():
        got = OwnConvs(kernel=False).conv(conv, x, bias)
        want = _time_major(conv, x, bias)
    assert got is not None and got.shape == want.shape == (3, 11, co)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("stride,kernel", [(2, 4), (8, 16), (3, 3), (4, 12)])
def test_conv_transposed_equals_torch(stride, kernel):
    torch.manual_seed(stride)
    conv = nn.ConvTranspose1d(20, 12, kernel, stride=stride)
    x = torch.randn(2, 9, 20)
    with torch.inference_mode():
        got = OwnConvs(kernel=False).conv_transposed(conv, x)
        want = F.conv_transpose1d(x.transpose(1, 2), conv.weight, None, stride=stride).transpose(1, 2)
    assert got is not None and got.shape == want.shape == (2, 8 * stride + kernel, 12)
    assert (got - want).abs().max().item() < 1e-5


def test_what_is_not_ours_goes_back_to_cudnn():
    own = OwnConvs(kernel=False)
    assert own.conv(nn.Conv1d(8, 8, 3, groups=2), torch.randn(1, 9, 8)) is None  # grouped, not depthwise
    assert own.conv(nn.Conv1d(8, 8, 4, stride=2), torch.randn(1, 9, 8)) is None  # strided
    assert own.conv_transposed(nn.ConvTranspose1d(8, 8, 5, stride=2), torch.randn(1, 9, 8)) is None  # k % s


@pytest.mark.parametrize("chunks", [[1] * 6, [4, 8, 3], [23]])
def test_streamed_with_own_convs_equals_whole(eager_engine, chunks):
    codec = eager_engine.ckpt.codec
    codes = random_codes(3, sum(chunks), seed=7 + len(chunks))
    with torch.inference_mode():
        whole = codec.decode(codes)[:, 0]
        dec = StreamingCodec(codec, rows=4, max_frames=4096, time_major=True, ring_chunk=8)
        dec.own_convs = OwnConvs(kernel=False)
        slots, parts, start = torch.tensor([2, 0, 3]), [], 0
        for k in chunks:
            parts.append(dec.codes_to_audio(slots, codes[:, :, start:start + k]))
            start += k
    streamed = torch.cat(parts, dim=-1)
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max().item() < TOL


@pytest.mark.skipif(not (triton_major() >= 3 and os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="the Triton kernel on CPU needs Triton >= 3's interpreter (on GPUs: test_gpu.py)")
@pytest.mark.parametrize("shape", [c for c in CONVS if c[4] == 1 and c[2] > 1])
def test_triton_kernel_in_the_interpreter(shape):
    from ttsengine.model.kernels.codec.conv import conv_time_major

    ci, co, k, d, _ = shape
    torch.manual_seed(k * d)
    conv = nn.Conv1d(ci, co, k, dilation=d)
    x = torch.randn(2, 3 + 70 + (k - 1) * d, ci)[:, 3:]
    with torch.inference_mode():
        got = conv_time_major(x, conv.weight.permute(2, 1, 0).contiguous(), d, conv.bias)
        want = _time_major(conv, x)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.skipif(not (triton_major() >= 3 and os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="the Triton kernel on CPU needs Triton >= 3's interpreter (on GPUs: test_gpu.py)")
@pytest.mark.parametrize("stride,kernel", [(2, 4), (8, 16), (4, 12)])
def test_triton_kernel_as_transposed_conv_in_the_interpreter(stride, kernel):
    # the upsampling convs on CUDA: the same kernel over the input read with kernel/stride - 1 zeros each side
    from ttsengine.model.kernels.codec.conv import conv_time_major

    torch.manual_seed(kernel)
    conv = nn.ConvTranspose1d(20, 12, kernel, stride=stride)
    x = torch.randn(2, 2 + 9, 20)[:, 2:]
    with torch.inference_mode():
        got = conv_time_major(x, transposed_weight_as_conv(conv.weight, stride), 1, pad=kernel // stride - 1)
        want = F.conv_transpose1d(x.transpose(1, 2), conv.weight, None, stride=stride).transpose(1, 2)
    assert got.shape == (2, 9 + kernel // stride - 1, stride * 12)
    assert (got.reshape(want.shape) - want).abs().max().item() < 1e-5


@pytest.mark.skipif(not (triton_major() >= 3 and os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="the Triton kernel on CPU needs Triton >= 3's interpreter (on GPUs: test_gpu.py)")
@pytest.mark.parametrize("shape", [(48, 40, 7, 3), (32, 48, 1, 1), (24, 24, 7, 1)], ids=["k7-d3", "1-tap", "k7-d1"])
def test_triton_kernel_epilogues_in_the_interpreter(shape):
    # codec_fused_convs: snake(conv + bias) and r + (conv + bias) stored by the conv against torch's conv and the
    # eager Snake / sum (fp32: equal up to the summation order and the sine)
    from ttsengine.model.kernels.codec.conv import conv_time_major

    ci, co, k, d = shape
    torch.manual_seed(ci + k)
    conv = nn.Conv1d(ci, co, k, dilation=d)
    x = torch.randn(2, 3 + 40 + (k - 1) * d, ci)[:, 3:]
    alpha = torch.rand(co) * 2 + 0.05
    with torch.inference_mode():
        w = conv.weight.permute(2, 1, 0).contiguous()
        y = _time_major(conv, x)
        snake = conv_time_major(x, w, d, conv.bias, snake_alpha=alpha)
        want = y + torch.sin(alpha * y) ** 2 / (alpha + 1e-9)
        assert (snake - want).abs().max().item() < 1e-4
        r = torch.randn(y.shape)
        summed = conv_time_major(x, w, d, conv.bias, residual=r)
        assert (summed - (r + y)).abs().max().item() < 1e-5
