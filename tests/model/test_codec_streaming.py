"""The codec streamed chunk by chunk (model/codec/streaming.py) equals decoding all frames at once (fp32 on
CPU, tight tolerance), at every chunk size, with rows joining, leaving and being reused; channel-major and
time-major (channels-last convolutions) alike, and with the transformer's keys and values in a ring (codec_kv_ring;
a ring of 3 takes the longer chunks in pieces)."""

from __future__ import annotations

import pytest
import torch

from ttsengine.model.codec.streaming import StreamingCodec

TOL = 5e-5  # fp32: summation order only (the deep codec amplifies 1e-7 latent rounding to ~1e-5)


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    sem = torch.randint(0, 32, (batch, 1, frames), generator=g)
    res = torch.randint(0, 16, (batch, 3, frames), generator=g)
    return torch.cat([sem, res], dim=1)


RING = pytest.mark.parametrize("ring", [0, 8, 3], ids=["plain", "ring8", "ring3"])  # feature codec_kv_ring


@RING
@pytest.mark.parametrize("time_major", [False, True], ids=["channels", "time_major"])
@pytest.mark.parametrize("chunks", [[1] * 9, [4, 8, 8, 3], [23], [2, 5, 1, 7, 8], [3, 20]])
def test_streamed_equals_whole(eager_engine, chunks, time_major, ring):
    codec = eager_engine.ckpt.codec
    total = sum(chunks)
    codes = random_codes(3, total, seed=len(chunks))
    with torch.inference_mode():
        whole = codec.decode(codes)[:, 0]
        dec = StreamingCodec(codec, rows=5, max_frames=4096, time_major=time_major, ring_chunk=ring)
        slots = torch.tensor([3, 0, 4])
        parts, start = [], 0
        for k in chunks:
            parts.append(dec.codes_to_audio(slots, codes[:, :, start:start + k]))
            start += k
    streamed = torch.cat(parts, dim=-1)
    assert streamed.shape == whole.shape == (3, total * 2048)
    assert (streamed - whole).abs().max().item() < TOL


@RING
@pytest.mark.parametrize("time_major", [False, True], ids=["channels", "time_major"])
def test_streams_in_one_batch_do_not_interfere(eager_engine, time_major, ring):
    """Two streams at different positions decoded together, one joining later, one reset and reused."""
    codec = eager_engine.ckpt.codec
    a, b = random_codes(1, 16, 1), random_codes(1, 12, 2)
    with torch.inference_mode():
        dec = StreamingCodec(codec, rows=2, max_frames=4096, time_major=time_major, ring_chunk=ring)
        out_a = [dec.codes_to_audio(torch.tensor([0]), a[:, :, :4])]
        out_b = []
        for i in range(3):  # b starts 4 frames later, decoded in the same calls as a
            pair = torch.cat([a[:, :, 4 + 4 * i: 8 + 4 * i], b[:, :, 4 * i: 4 + 4 * i]])
            y = dec.codes_to_audio(torch.tensor([0, 1]), pair)
            out_a.append(y[:1])
            out_b.append(y[1:])
        assert (torch.cat(out_a, -1) - codec.decode(a)[:, 0]).abs().max() < TOL
        assert (torch.cat(out_b, -1) - codec.decode(b)[:, 0]).abs().max() < TOL
        dec.reset(torch.tensor([1]))
        again = dec.codes_to_audio(torch.tensor([1]), b)
        assert (again - codec.decode(b)[:, 0]).abs().max() < TOL


def test_time_major_snake_beyond_the_launch_grid_runs_the_eager_ops(monkeypatch):
    # a chunk whose last decoder stage needs more than CUDA's 65,535 blocks on the kernel's second grid axis (~340
    # frames) runs Snake as the eager ops (the guard runs before any launch: checked here with the limit lowered)
    from ttsengine.model.codec.conv import snake_time_major
    from ttsengine.model.kernels.codec import snake as snake_kernels

    monkeypatch.setattr(snake_kernels, "MAX_GRID_Y", 1)
    g = torch.Generator().manual_seed(4)
    x, bias = torch.randn(2, 700, 8, generator=g), torch.randn(8, generator=g)
    alpha = torch.rand(1, 8, 1, generator=g) + 0.1
    buf = torch.zeros(2, 710, 8)
    got = snake_kernels.snake_triton_time_major(x, alpha, out=buf[:, 10:], bias=bias)
    assert got.data_ptr() == buf[:, 10:].data_ptr()
    assert torch.equal(buf[:, 10:], snake_time_major(x, alpha, bias=bias)) and not buf[:, :10].any()
