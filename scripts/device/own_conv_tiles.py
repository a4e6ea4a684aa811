"""Issues 46 and 44, feature codec_own_convs: where the codec's own convolutions lose to cuDNN's and which tiles win.
Random S1-mini codec, bf16, time-major, Triton Snake, one chunk of CHUNK frames for STREAMS rows (the vocoder's graph
shapes at the engine's largest batch). Prints:
1. the whole chunk's GPU time (CUDA events, median of 10) with cuDNN's convs (autotuned) and with ours, and the top
   kernels of each (torch profiler, one chunk);
2. per distinct conv the codec runs (kind, k, dilation, Ci -> Co, positions): cuDNN's ms (autotuned), ours with
   tiles()'s pick, and the best of a sweep of (BM, BN, BK, warps, stages) for the dense k-tap ones and the transposed
   ones (run as the kernel's padded m-tap convs).
Usage: python3 scripts/device/own_conv_tiles.py [streams] [chunk_frames]   (default 256 8; SWEEP=0: no sweep)
"""
import itertools
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from ttsengine.model.codec.own_convs import OwnConvs, _taps_major, transposed_as_conv
from ttsengine.model.codec.streaming import StreamingCodec
from ttsengine.model.kernels.codec.conv import conv_time_major, tiles
from ttsengine.model.kernels.codec.snake import residual_bias_triton, snake_triton, snake_triton_time_major
from ttsengine.model.loading.synthetic import random_checkpoint
from ttsengine.tools.codec_bench import random_codes


def decoder(codec, streams: int, own: bool) -> StreamingCodec:
    dec = StreamingCodec(codec, streams, 4096, time_major=True)
    dec.snake, dec.snake_time_major, dec.residual_bias = snake_triton, snake_triton_time_major, residual_bias_triton
    dec.own_convs = OwnConvs(kernel=True) if own else None
    return dec


def chunk_ms(dec, slots, codes, chunk: int) -> float:
    for i in range(3):
        dec.codes_to_audio(slots, codes[:, :, i * chunk:(i + 1) * chunk])
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dec.codes_to_audio(slots, codes[:, :, 3 * chunk:4 * chunk])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def top_kernels(dec, slots, codes, chunk: int, n: int = 8) -> None:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.codes_to_audio(slots, codes[:, :, 3 * chunk:4 * chunk])
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    rows.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows)
    print(f"  kernels' total {total / 1e3:.2f} ms")
    for e in rows[:n]:
        print(f"  {e.self_device_time_total / 1e3:8.2f} ms {e.count:4d}x  {e.key[:110]}")


def recorded_convs(dec, slots, codes, chunk: int) -> dict:
    """(kind, k, d, ci, co, x shape) -> (conv, x, bias) for each distinct conv call of one chunk."""
    seen, own = {}, dec.own_convs
    plain, transposed = own.conv, own.conv_transposed

    def conv(c, x, bias=True):
        key = ("conv", c.kernel_size[0], c.dilation[0], c.in_channels, c.out_channels, c.groups, tuple(x.shape))
        seen.setdefault(key, (c, x.clone(), bias))
        return plain(c, x, bias)

    def conv_t(c, x):
        key = ("transposed", c.kernel_size[0], c.stride[0], c.in_channels, c.out_channels, c.groups, tuple(x.shape))
        seen.setdefault(key, (c, x.clone(), False))
        return transposed(c, x)

    own.conv, own.conv_transposed = conv, conv_t
    dec.codes_to_audio(slots, codes[:, :, 3 * chunk:4 * chunk])
    own.conv, own.conv_transposed = plain, transposed
    return seen


def cudnn(key, c, x, bias):
    x4 = x.transpose(1, 2)[:, :, None]
    w = c.weight.detach()[:, :, None].contiguous(memory_format=torch.channels_last)
    if key[0] == "transposed":
        return lambda: F.conv_transpose2d(x4, w, None, stride=(1, c.stride[0]), groups=c.groups)
    return lambda: F.conv2d(x4, w, c.bias if bias else None, dilation=(1, c.dilation[0]), groups=c.groups)


def sweep(w, x, d, b, ci: int, co: int, pad: int = 0):
    best = None
    for bm, bn, bk, (warps, stages) in itertools.product((64, 128, 256), (32, 64, 128, 256), (32, 64),
                                                         ((4, 3), (8, 3), (4, 4), (8, 4))):
        if bn > max(16, 2 * co) or bk > max(32, ci) or (bm == 256 and warps == 4):
            continue
        tile = (bm, bn, bk, warps, stages)
        try:
            ms = do_bench(lambda tile=tile: conv_time_major(x, w, d, b, pad=pad, tile=tile), warmup=5, rep=20)
        except Exception as e:  # a tile that does not fit shared memory
            print(f"    tile {tile}: {type(e).__name__}")
            continue
        if best is None or ms < best[0]:
            best = (ms, tile)
    return best


def main():
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    torch.backends.cudnn.benchmark = True
    codec = random_checkpoint("s1-mini", "cuda", torch.bfloat16, torch.bfloat16).codec
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"streams {streams} chunk {chunk} frames, bf16")
    codes = random_codes(codec, streams, chunk * 4, torch.device("cuda"))
    slots = torch.arange(streams, device="cuda")
    with torch.inference_mode():
        decs = {"cudnn": decoder(codec, streams, False), "own": decoder(codec, streams, True)}
        for name, dec in decs.items():
            print(f"## {name}: one chunk {chunk_ms(dec, slots, codes, chunk):.2f} ms (median of 10)")
            top_kernels(dec, slots, codes, chunk)
        calls = recorded_convs(decs["own"], slots, codes, chunk)
        own = decs["own"].own_convs
        print("| conv | k | d/s | Ci -> Co | groups | x | cuDNN ms | ours ms | tiles() | best swept ms | best tile |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        total = {"cudnn": 0.0, "ours": 0.0, "best": 0.0}
        for key, (c, x, bias) in sorted(calls.items(), key=lambda kv: kv[0][6][1]):
            kind, k, ds, ci, co, groups, shape = key
            ref = do_bench(cudnn(key, c, x, bias), warmup=5, rep=20)
            mine = do_bench((lambda c=c, x=x: own.conv_transposed(c, x)) if kind == "transposed" else
                            (lambda c=c, x=x, bias=bias: own.conv(c, x, bias)), warmup=5, rep=20)
            pick, best = "", None
            sweeping = os.environ.get("SWEEP", "1") != "0"
            if kind == "conv" and k > 1 and groups == 1:
                m = shape[0] * (shape[1] - (k - 1) * ds)
                pick = tiles(m, ci, co)
                if sweeping:
                    w = own._weight(c, _taps_major)
                    best = sweep(w, x if x.stride(2) == 1 else x.contiguous(), ds, c.bias if bias else None, ci, co)
            elif kind == "transposed" and k > ds:  # the same kernel: an m-tap conv to s x Co over padded input
                m_taps = k // ds
                pick = tiles(shape[0] * (shape[1] + m_taps - 1), ci, ds * co)
                if sweeping:
                    w = own._weight(c, transposed_as_conv)
                    best = sweep(w, x.contiguous(), 1, None, ci, ds * co, pad=m_taps - 1)
            total["cudnn"] += ref
            total["ours"] += mine
            total["best"] += best[0] if best else mine
            swept = f"{best[0]:.3f} | {best[1]}" if best else " | "
            print(f"| {kind} | {k} | {ds} | {ci} -> {co} | {groups} | {list(shape)} | {ref:.3f} | {mine:.3f} | {pick} "
                  f"| {swept} |")
        print(f"distinct convs once each: cuDNN {total['cudnn']:.2f} ms, ours {total['ours']:.2f}, "
              f"ours with the best tiles {total['best']:.2f}")


if __name__ == "__main__":
    main()
