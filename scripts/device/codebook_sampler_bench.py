"""The codebook sampler (kernels/codebook_sampler.py) as a frame runs it: 9 calls over the fast head's 1,024 bf16
logits with the 16-id window and the next input's embedding row (4,096 x 1,024 bf16), captured in a CUDA graph and
replayed, for each warp count per program. Prints us per call and whether every warp count draws the same tokens.
Usage: python3 scripts/device/codebook_sampler_bench.py [rows ...] (default 1 2 8 64); WARPS="1 2 4 8"."""
import os
import sys

import torch
import triton
from graph_timing import graphed_us

from ttsengine.model.kernels import codebook_sampler as cs
from ttsengine.model.sampling import SamplingTensors


def main():
    rows = [int(a) for a in sys.argv[1:]] or [1, 2, 8, 64]
    warps = [int(w) for w in os.environ.get("WARPS", "1 2 4 8").split()]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    print("| rows | " + " | ".join(f"{w} warps us" for w in warps) + " | same tokens |")
    g = torch.Generator().manual_seed(0)
    table = torch.randn(4096, 1024, generator=g).to("cuda", torch.bfloat16)
    for B in rows:
        logits = (torch.randn(B, 1024, generator=g) * 3).to("cuda", torch.bfloat16)
        p = SamplingTensors.from_values([(0.8, 0.8, 1.1, s) for s in range(B)], "cuda")
        ids = torch.randint(0, 1024, (B, 16), generator=g).cuda()
        counter = torch.arange(B, device="cuda") * 10
        args = (logits, p.temperature, p.top_p, p.repetition_penalty, ids, p.seed_lo, p.seed_hi, counter)
        times, tokens = [], []
        for w in warps:
            cs.NUM_WARPS = w
            calls = [lambda k=k, a=args: cs.sample_codebook_embed(*a, k, table) for k in range(1, 10)]
            times.append(graphed_us(calls, 50))
            tokens.append(torch.stack([c()[0] for c in calls]))
        same = all(torch.equal(t, tokens[0]) for t in tokens)
        print(f"| {B} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |", flush=True)


if __name__ == "__main__":
    main()
