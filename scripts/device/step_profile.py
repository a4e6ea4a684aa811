"""Where one decode step goes (real S1-mini shapes, random weights, the engine's own settings): the graphed
step's time per bucket, then a profile of the (compiled, uncaptured) step at the first: kernels per frame and GPU
time per kernel class. Usage: python3 scripts/device/step_profile.py [ROWS ...]
(default 2 8 64: compiled buckets start at 2). Env as the engine's (TTS_COMPILE, TTS_QUANT, TTS_FUSED_KERNELS ...)."""
import re
import sys
import time
from collections import defaultdict

import torch

from ttsengine.config import from_env
from ttsengine.engine.engine import Engine
from ttsengine.engine.loader import load
from ttsengine.engine.runner import PrefillItem
from ttsengine.synthesis.request import SynthesisRequest

ROWS = [int(a) for a in sys.argv[1:]] or [2, 8, 64]
cfg = from_env(max_batch=max(ROWS))
engine = Engine(load(cfg, "s1-mini"), cfg)
engine.start()
engine.submit(SynthesisRequest(text="Warm up.", seed=0, max_new_tokens=8), ignore_stop=True).result()
engine.settle(600)
engine.close()
r, graphs = engine.runner, engine.graphs
n = engine.ckpt.config.num_codebooks
with torch.inference_mode():
    r.prefill([PrefillItem(s, torch.randint(0, 1000, (n + 1, 45)), (0.8, 0.8, 1.1, s), 0) for s in range(max(ROWS))])
    for s in range(max(ROWS)):
        r.ensure_pages([(s, 45 + 200)])


def step(bb):
    return graphs.run(bb) if graphs is not None else r.decode_step(bb)


print(f"| rows | ms per step (graphed={graphs is not None}) | frames/s |", flush=True)
with torch.inference_mode():
    for bb in ROWS:
        for _ in range(3):
            step(bb)
        torch.cuda.synchronize()
        reps = 50
        t0 = time.perf_counter()
        for _ in range(reps):
            step(bb)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / reps * 1e3
        print(f"| {bb} | {ms:.3f} | {bb / ms * 1e3:,.0f} |", flush=True)

CLASSES = (("gemm/gemv", r"gemm|gemv|cutlass|sm90|nvjet|xmma|cublas|splitK|matmul|_mm_|mm_kernel|int8|small_linear"),
           ("sort", r"sort|radix|Sort"), ("scan (cumsum)", r"scan|cumsum|Scan"),
           # the paged attention's Triton kernel is named `kernel`, the codebook sampler's `_kernel`
           ("attention", r"attend|paged|flash|fmha|sdpa|attention|^kernel$"), ("codebook sampler", r"^_kernel$"),
           ("triton fused", r"^triton_"), ("reduce", r"reduce|Reduce|argmax|max"),
           ("copy/fill/index", r"copy|fill|index|gather|scatter|cat|Memcpy|Memset|elementwise|vectorized"))


def klass(name):
    return next((c for c, pat in CLASSES if re.search(pat, name)), "other")


from torch.profiler import ProfilerActivity, profile  # noqa: E402

for bb in ROWS[:1]:
    with torch.inference_mode():
        r.decode_step(bb)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                r.decode_step(bb)
            torch.cuda.synchronize()
    by = defaultdict(lambda: [0, 0.0])
    names = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            c = klass(e.name)
            by[c][0] += 1
            by[c][1] += e.device_time_total
            names[e.name[:90]][0] += 1
            names[e.name[:90]][1] += e.device_time_total
    total_k = sum(v[0] for v in by.values()) / 5
    total_us = sum(v[1] for v in by.values()) / 5
    print(f"\nuncaptured step at {bb} row(s): {total_k:.0f} kernels, {total_us:,.0f} us GPU per frame")
    print("| class | kernels/frame | us/frame | us/kernel |")
    for c, (k, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {c} | {k / 5:.0f} | {us / 5:,.0f} | {us / max(k, 1):.1f} |")
    print("top kernels:")
    for nm, (k, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {us / 5:8.0f} us  x{k / 5:<5.0f} {nm}")
