"""Where one frame's decoder-layer kernels spend their time at 1-2 rows (layer_gemv, S1-mini shapes, bf16): the
frame of pdl_bench.py (28 slow layers, 10 x 4 fast layers) replayed in a CUDA graph under the profiler; each kernel
labelled by its place in the layer (qkv, attention, wo, w13, w2), mean us and achieved GB/s of its weights.
Usage: python3 scripts/device/gemv_profile.py [rows] [pdl 0|1]"""
import sys
from collections import defaultdict

import torch
from pdl_bench import real_block

from ttsengine.model import fused_layer
from ttsengine.model.kernels.paged_attention import PagedKV
from ttsengine.model.layers import rope_table

PARTS = ("qkv", "attention", "wo", "w13", "w2")
MB = {("slow", "qkv"): 8.4, ("slow", "wo"): 4.2, ("slow", "w13"): 12.6, ("slow", "w2"): 6.3,
      ("fast", "qkv"): 4.2, ("fast", "wo"): 2.1, ("fast", "w13"): 12.6, ("fast", "w2"): 6.3}  # weight bytes / 1e6


def main():
    M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    pdl = len(sys.argv) > 2 and sys.argv[2] == "1"
    slow = [real_block(False, False)[0] for _ in range(28)]
    fast = [real_block(False, True)[0] for _ in range(4)]
    pool_s = PagedKV.empty(M * 4 + 1, 8, 64, 128, torch.bfloat16, "cuda")
    pool_f = PagedKV.empty(M + 1, 8, 16, 64, torch.bfloat16, "cuda")
    table_s = (1 + torch.arange(M * 4, device="cuda", dtype=torch.int32)).view(M, 4)
    table_f = (1 + torch.arange(M, device="cuda", dtype=torch.int32))[:, None]
    pos_s, pos_f = torch.full((M,), 150, device="cuda"), torch.full((M,), 5, device="cuda")
    rope_s = rope_table(256, 128, 1e6, "cuda")[pos_s][:, None]
    rope_f = rope_table(16, 64, 1e6, "cuda")[pos_f][:, None]
    x = torch.randn(M, 1, 1024, device="cuda", dtype=torch.bfloat16)
    fn = fused_layer.make_layer(True, pdl)

    def frame():
        y = x
        for layer in slow:
            y = fn(layer, y, rope_s, pool_s.k, pool_s.v, table_s, pos_s)
        for _ in range(10):
            for layer in fast:
                y = fn(layer, y, rope_f, pool_f.k, pool_f.v, table_f, pos_f)
        return y

    with torch.inference_mode():
        frame()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            frame()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and e.device_time > 0), key=lambda e: e.time_range.start)
    per = 28 * 5 + 40 * 5
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} rows {M} pdl {pdl}: {len(kernels)} kernels "
          f"({per} a frame expected)")
    acc = defaultdict(list)
    gaps = defaultdict(list)
    for i, e in enumerate(kernels):
        j = i % per
        kind = "slow" if j < 140 else "fast"
        part = PARTS[j % 5]
        acc[(kind, part)].append(e.device_time)
        if i:
            gaps[(kind, part)].append(e.time_range.start - kernels[i - 1].time_range.end)
    print("| layer | part | n/frame | us mean | gap before us | GB/s |")
    total = 0.0
    for key, ts in acc.items():
        mean = sum(ts) / len(ts)
        n = len(ts) / 10
        total += mean * n
        gb = f"{MB[key] * 1e6 / (mean * 1e-6) / 1e9:.0f}" if key in MB else "-"
        print(f"| {key[0]} | {key[1]} | {n:.0f} | {mean:.2f} | {sum(gaps[key]) / max(1, len(gaps[key])):.2f} | {gb} |")
    print(f"kernel time per frame {total:.0f} us; span per frame "
          f"{(kernels[-1].time_range.end - kernels[0].time_range.start) / 10:.0f} us")


if __name__ == "__main__":
    main()
