"""layer_gemv with and without programmatic dependent launch (TTS_FEATURES pdl), S1-mini shapes, bf16, in a
CUDA graph: one frame's decoder-layer work (28 slow layers, then 10 positions x 4 fast layers, 140 + 200 kernels),
and the 4 fast layers of one position alone. Usage: python3 scripts/device/pdl_bench.py [rows ...] (default 1 2 8)
TILES="swiglu:4x1024w4 all:16x1024w8 ..." (bf16 only): the frame again with the 1-2-row CUDA-core tiles replaced
(`swiglu`: the W1|W3 layers', `wide`: > 1,024 columns, `narrow`: 1,024 columns), NxKwW; WEIGHTS=bf16 skips int8."""
import os
import sys

import torch
import triton
from graph_timing import graphed_us

sys.path.insert(0, "tests")
from real_block import real_block  # noqa: E402

from ttsengine.model import fused_layer
from ttsengine.model.kernels.launch import pdl_runs
from ttsengine.model.kernels.paged_attention import PagedKV
from ttsengine.model.layers import rope_table


def tiles_variant(spec: str):
    """'swiglu:4x1024w4 wide:16x1024w8' -> a small_linear_config replacement for <= CORE_ROWS rows."""
    from ttsengine.model.kernels import small_linear as sl

    default = sl.small_linear_config
    over = {}
    for item in spec.split():
        kind, t = item.split(":")
        n, rest = t.split("x")
        k, w = rest.split("w")
        over[kind] = sl.SmallLinearConfig(int(n), int(k), int(w), 2, use_dot=False)

    def config(n_out, k, dtype, swiglu=False, rows=16, norm=True, pdl=False):
        kind = "swiglu" if swiglu else "wide" if n_out > 1024 else "narrow"
        if rows <= sl.CORE_ROWS and kind in over and n_out < 16384:
            c = over[kind]
            return sl.SmallLinearConfig(c.block_n, min(c.block_k, max(16, sl.next_pow2(k))), c.num_warps, 2, False)
        return default(n_out, k, dtype, swiglu, rows, norm, pdl)

    return config


def main():
    rows = [int(a) for a in sys.argv[1:]] or [1, 2, 8]
    variants = [v for v in os.environ.get("TILES", "").split(",") if v.strip()]
    import torch._inductor.config as ic

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
          "pdl runs:", pdl_runs(torch.device("cuda")), "inductor enable_pdl:", hasattr(ic.triton, "enable_pdl"))
    print("| weights | rows | work | plain us | pdl us | ratio |")
    for quant in [q == "int8" for q in os.environ.get("WEIGHTS", "bf16,int8").split(",")]:
        slow = [real_block(quant, False) for _ in range(28)]
        fast = [real_block(quant, True) for _ in range(4)]
        for M in rows:
            time_rows(M, slow, fast, quant)
        if not quant and variants:
            from ttsengine.model.kernels import small_linear as sl

            default = sl.small_linear_config
            for v in variants:
                sl.small_linear_config = tiles_variant(v)
                print(f"tiles {v}:")
                for M in rows:
                    time_rows(M, slow, fast, quant)
            sl.small_linear_config = default


def time_rows(M: int, slow, fast, quant: bool) -> None:
    pool_s = PagedKV.empty(M * 4 + 1, 8, 64, 128, torch.bfloat16, "cuda")
    pool_f = PagedKV.empty(M + 1, 8, 16, 64, torch.bfloat16, "cuda")
    table_s = (1 + torch.arange(M * 4, device="cuda", dtype=torch.int32)).view(M, 4)
    table_f = (1 + torch.arange(M, device="cuda", dtype=torch.int32))[:, None]
    pos_s = torch.full((M,), 150, device="cuda")
    pos_f = torch.full((M,), 5, device="cuda")
    rope_s = rope_table(256, 128, 1e6, "cuda")[pos_s][:, None]
    rope_f = rope_table(16, 64, 1e6, "cuda")[pos_f][:, None]
    x = torch.randn(M, 1, 1024, device="cuda", dtype=torch.bfloat16)

    def frame(fn, positions=10, with_slow=True):
        y = x
        if with_slow:
            for layer, _ in slow:
                y = fn(layer, y, rope_s, pool_s.k, pool_s.v, table_s, pos_s)
        for _ in range(positions):
            for layer, _ in fast:
                y = fn(layer, y, rope_f, pool_f.k, pool_f.v, table_f, pos_f)
        return y

    for work, kw in (("frame (340 kernels)", {}), ("1 fast position (20)", {"positions": 1, "with_slow": False})):
        us = []
        for pdl in (False, True):
            fn = fused_layer.make_layer(True, pdl)
            with torch.inference_mode():
                us.append(graphed_us([lambda fn=fn, kw=kw: frame(fn, **kw)], 30))
        print(f"| {'int8' if quant else 'bf16'} | {M} | {work} | {us[0]:.1f} | {us[1]:.1f} | {us[1] / us[0]:.3f} |")


if __name__ == "__main__":
    main()
