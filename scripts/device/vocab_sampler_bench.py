"""The slow token's sampler: the sorted reference as the engine compiles it (frame.sample_token_blocked under
torch.compile, top-p as ATen's segmented sort) vs the sort-free kernels (kernels/vocab_sampler.py), bf16 logits over
the real 155,776-wide vocabulary, the window of 11 ids, captured in a CUDA graph and replayed. Prints us per call and
how often the two draw the same token. Usage: python3 scripts/device/vocab_sampler_bench.py [rows ...]
(default 1 2 8 64 256); SCALE=logit std (default 1.0: random weights' near-flat rows; 6: a peaked model);
STAGES=1: also the sort-free kernels' cumulative time by stage (stats; + hist; + mass + cut; the whole
call above) and how many entries a row counts (those at or above its floor)."""
import os
import sys

import torch
import triton
from graph_timing import graphed_us

from ttsengine.model.frame import sample_token_blocked
from ttsengine.model.kernels.vocab_sampler import sample_vocab_triton
from ttsengine.model.sampling import SamplingTensors, register_top_p_op

V = 155_776


def main():
    rows = [int(a) for a in sys.argv[1:]] or [1, 2, 8, 64, 256]
    scale = float(os.environ.get("SCALE", "1.0"))
    register_top_p_op()
    reference = torch.compile(sample_token_blocked, dynamic=False)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, "scale", scale)
    print("| rows | sorted (compiled) us | sort-free us | ratio | same token |")
    g = torch.Generator().manual_seed(0)
    for B in rows:
        logits = (torch.randn(B, V, generator=g) * scale).to("cuda", torch.bfloat16)
        p = SamplingTensors.from_values([(0.7, 0.8, 1.2, 1000 + i) for i in range(B)], "cuda")
        ids = torch.randint(0, V, (B, 11), generator=g).to("cuda")
        counter = torch.arange(B, device="cuda") * 10
        args = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
        with torch.inference_mode():
            ref_us = graphed_us([lambda x=logits, a=args: reference(x, *a)])
            new_us = graphed_us([lambda x=logits, a=args: sample_vocab_triton(x, *a)])
            same = 0
            for step in range(8):
                c = counter + step
                a = (p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, c)
                same += (reference(logits, *a) == sample_vocab_triton(logits, *a)).sum().item()
        print(f"| {B} | {ref_us:.1f} | {new_us:.1f} | {new_us / ref_us:.2f} | {same}/{8 * B} |")
        if os.environ.get("STAGES"):
            stages(logits, p, ids)


def stages(logits, p, ids):
    from ttsengine.model.kernels import vocab_sampler as vs

    B, V = logits.shape
    NC = triton.cdiv(V, vs.CHUNK)
    NCP = max(16, triton.next_power_of_2(NC))
    stats = torch.empty(B, NC, 2, device="cuda")
    counts = torch.zeros(B, vs.KEYS, dtype=torch.int32, device="cuda")
    floor = torch.empty(B, device="cuda")
    packed = torch.empty(B, dtype=torch.int64, device="cuda")
    row = (logits, logits.stride(0), V, ids, ids.stride(0), ids.shape[1], p.repetition_penalty)

    def zero_and_stats(hist=False):
        counts.zero_()
        vs._stats_kernel[(B, NC)](*row, stats, packed, NC, CHUNK_=vs.CHUNK, HAS_IDS=True, WP=16, num_warps=4)
        if hist:
            vs._hist_kernel[(B, NC)](*row, p.top_p, stats, counts, floor, NC, CHUNK_=vs.CHUNK, NCP=NCP, HAS_IDS=True,
                                     WP=16, num_warps=4)

    with torch.inference_mode():
        t1 = graphed_us([counts.zero_])
        t2 = graphed_us([zero_and_stats])
        t3 = graphed_us([lambda: zero_and_stats(True)])
        t4 = graphed_us([lambda: vs._cut(logits, p.top_p, p.repetition_penalty, ids, p.seed_lo)])
        zero_and_stats(True)
        counted = int(counts.sum())
    print(f"|   stages | memset {t1:.1f} | + stats {t2:.1f} | + hist {t3:.1f} | + mass + cut {t4:.1f} | "
          f"counted {counted / B:.0f} of {V} a row |")


if __name__ == "__main__":
    main()
