"""The slow layers' paged attention kernel (RMSNorm q/k + RoPE + cache write + attention, real S1-mini shapes: 16
query heads, 8 KV heads of 128, pages of 64) with its page loop software-pipelined or not
(paged_attention.PIPELINE_STAGES), captured in a CUDA graph and replayed. Prints us per call per stage count and
whether the outputs equal the unpipelined kernel's bit for bit. SPLITS="1 2 4 8": then the same with each row and
head's pages shared by that many programs + the combine kernel (split_attention), at the default stages.
Usage: python3 scripts/device/attention_bench.py [stages ...] (default 1 2 3); ROWS="1 2 8 64",
CONTEXTS="150 600 2000"."""
import os
import sys

import torch
import triton
from graph_timing import graphed_us

from ttsengine.model.kernels import paged_attention as pa
from ttsengine.model.layers import rope_table


def main():
    stages = [int(a) for a in sys.argv[1:]] or [1, 2, 3]
    rows = [int(x) for x in os.environ.get("ROWS", "1 2 8 64").split()]
    contexts = [int(x) for x in os.environ.get("CONTEXTS", "150 600 2000").split()]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    print("| rows | context | " + " | ".join(f"stages {s} us" for s in stages) + " | equal |")
    g = torch.Generator().manual_seed(0)
    H, Hk, d, page = 16, 8, 128, 64
    rope_rows = rope_table(8192, d, 1_000_000.0, "cuda")
    default = pa.PIPELINE_STAGES
    qn, kn = (torch.rand(d, generator=g).to("cuda", torch.bfloat16) + 0.5 for _ in range(2))
    for B in rows:
        for ctx in contexts:
            pages = (ctx + page) // page + 1
            kv = pa.PagedKV.empty(B * pages + 1, Hk, page, d, torch.bfloat16, "cuda")
            kv.k.copy_(torch.randn(kv.k.shape, generator=g))
            kv.v.copy_(torch.randn(kv.v.shape, generator=g))
            table = (1 + torch.randperm(B * pages, generator=g)).view(B, pages).to("cuda", torch.int32)
            pos = torch.full((B,), ctx, device="cuda")
            qkv = torch.randn(B, (H + 2 * Hk) * d, generator=g).to("cuda", torch.bfloat16)
            rope = rope_rows[pos]

            def call(qkv=qkv, rope=rope, kv=kv, table=table, pos=pos, splits=1):
                return pa.paged_write_decode_qkv_triton(qkv, rope, qn, kn, 1e-6, kv, table, pos, H, False, splits)

            times, outs = [], []
            for s in stages:
                pa.PIPELINE_STAGES = s
                with torch.inference_mode():
                    times.append(graphed_us([call], reps=50))
                    outs.append(call().clone())
            equal = all(torch.equal(o, outs[0]) for o in outs)
            print(f"| {B} | {ctx} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {equal} |")
            pa.PIPELINE_STAGES = default
            for sp in [int(x) for x in os.environ.get("SPLITS", "").split()]:
                with torch.inference_mode():
                    us = graphed_us([lambda c=call, n=sp: c(splits=n)], reps=50)
                    err = (call(splits=sp).float() - outs[0].float()).abs().max().item()
                print(f"|   splits {sp} | {us:.1f} us | max diff {err:.3g} |")


if __name__ == "__main__":
    main()
