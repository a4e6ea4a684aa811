"""The fast transformer at one position, S1-mini shapes, bf16, 1-2 rows, replayed in a CUDA graph: the four
layer_gemv layers (20 kernels) against the persistent fast_stack kernel at several launch shapes.
Usage: python3 scripts/device/fast_stack_bench.py [rows ...]   (default 1 2)"""
import sys

import torch

sys.path.insert(0, "tests")
from graph_timing import graphed_us  # noqa: E402
from model.test_fast_stack import REAL, Fast  # noqa: E402

from ttsengine.model.fast_stack import stack_fast_layers  # noqa: E402
from ttsengine.model.fused_layer import make_layer  # noqa: E402
from ttsengine.model.kernels.fast_stack import FastStackConfig, fast_stack  # noqa: E402
from ttsengine.model.layers import rope_table  # noqa: E402

CONFIGS = {
    "default": FastStackConfig(),
    "w4": FastStackConfig(num_warps=4),
    "bn16": FastStackConfig(bn_o=16, bn_13=16, bn_2=16),
    "bn8": FastStackConfig(bn_qkv=8, bn_o=8, bn_13=8, bn_2=8),
    "bn4": FastStackConfig(bn_qkv=8, bn_o=4, bn_13=4, bn_2=4, num_warps=4),
}


def barrier_us(grid: int, n: int = 1000) -> float:
    from ttsengine.model.kernels import fast_stack as fs

    fs._kernel()
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    return graphed_us([lambda: fs._barrier_only_kernel[(grid,)](sync, n, GRID=grid)], 5) / n


def time_rows(M: int, model, layer_fn, weights) -> None:
    x = torch.randn(M, 1, 1024, device="cuda", dtype=torch.bfloat16)
    rope = rope_table(10, 64, 1e6, "cuda")[5].expand(M, 32, 2).contiguous()
    # layer_gemv: each layer's paged fast cache, one page of 16 positions per row
    pools = [(torch.randn(M, 8, 16, 64, device="cuda", dtype=torch.bfloat16),) * 2 for _ in range(4)]
    table = torch.arange(M, device="cuda", dtype=torch.int32)[:, None]
    pos = torch.full((M,), 5, device="cuda")

    def gemv():
        y = x
        for layer, (k, v) in zip(model.fast_layers, pools):
            y = layer_fn(layer, y, rope[:, None], k, v, table, pos)
        return y

    print(f"| {M} | layer_gemv (20 kernels) | {graphed_us([gemv], 50):.1f} |")
    kc = torch.randn(4, M, 8, 10, 64, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    for name, cfg in CONFIGS.items():
        us = graphed_us([lambda cfg=cfg: fast_stack(x[:, 0], weights, kc, vc, rope, 5, cfg)], 50)
        print(f"| {M} | fast_stack {name} {cfg} | {us:.1f} |")


def main():
    rows = [int(a) for a in sys.argv[1:]] or [1, 2]
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for grid in (sms, 64, 16):
        print(f"grid barrier, {grid} programs: {barrier_us(grid):.2f} us")
    model = Fast(**REAL, qk_norm=False).prepare(torch.bfloat16, "cuda")
    layer_fn = make_layer(True)
    weights = stack_fast_layers(model)  # the modules (and so layer_gemv) now read views of the stack
    print("| rows | path | us per position (4 layers) |")
    for M in rows:
        time_rows(M, model, layer_fn, weights)


if __name__ == "__main__":
    main()
