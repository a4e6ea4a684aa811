"""Where one decode step goes (real S1-mini shapes, random weights, the engine's own settings): the graphed
step's time per bucket; the timeline of its graph replays per bucket (kernels per frame, their time, the time each
class adds to the frame: kernels overlap under PDL, so a kernel's share is how far it moves the end of the work
done so far); then a profile of the (compiled, uncaptured) step at the first bucket: GPU time per kernel class.
Usage: python3 scripts/device/step_profile.py [ROWS ...] (default 2 8 64). Env as the engine's (TTS_FEATURES,
TTS_QUANT ...)."""
import os
import re
import sys
import time
from collections import defaultdict

import torch

from ttsengine.config import from_env
from ttsengine.engine.control.page_pool import PagePool
from ttsengine.engine.device.runner import PrefillItem
from ttsengine.engine.engine import Engine
from ttsengine.engine.loader import load
from ttsengine.synthesis.request import SynthesisRequest

ROWS = [int(a) for a in sys.argv[1:]] or [2, 8, 64]
cfg = from_env(max_batch=max(ROWS))
engine = Engine(load(cfg, "s1-mini"), cfg)
engine.start()
engine.submit(SynthesisRequest(text="Warm up.", seed=0, max_new_tokens=8), ignore_stop=True).result()
engine.settle(600)
engine.close()
r, graphs = engine.runner, engine.device.graphs
pool = PagePool(r.cfg.num_pages, r.cfg.max_slots, r.cfg.page_size)  # pages for every position the steps write
n = engine.ckpt.config.num_codebooks
with torch.inference_mode():
    for s in range(max(ROWS)):
        pool.grow(s, 45 + 200)
    r.prefill([PrefillItem(s, torch.randint(0, 1000, (n + 1, 45)), (0.8, 0.8, 1.1, s), 0,
                           pages=tuple(pool.slot_pages[s])) for s in range(max(ROWS))])


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
           ("attention", r"attend|paged|flash|fmha|sdpa|attention|^kernel$|^combine$"),
           ("codebook sampler", r"^_kernel$|codebook"),
           ("vocab sampler", r"^_(stats|mass|cut|draw|finish)_kernel$"),
           ("triton fused", r"^triton_"), ("reduce", r"reduce|Reduce|argmax|max"),
           ("copy/fill/index", r"copy|fill|index|gather|scatter|cat|Memcpy|Memset|elementwise|vectorized"))


def klass(name):
    return next((c for c, pat in CLASSES if re.search(pat, name)), "other")


from torch.profiler import ProfilerActivity, profile  # noqa: E402

REPLAYS = 5
for bb in ROWS if graphs is not None else []:
    with torch.inference_mode():
        step(bb)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                step(bb)
            torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    if not spans:
        print(f"\nno kernels recorded in the graph replays at {bb} rows")
        continue
    by = defaultdict(lambda: [0, 0.0, 0.0])  # class -> kernels, their time, the time they add to the frame
    top = defaultdict(lambda: [0, 0.0])
    frontier = spans[0][0]
    dump = ["start_us,end_us,added_us,name"]  # every kernel in order, to $OUT/timeline_ROWS.csv
    for start, end, name in spans:
        c, added = klass(name), max(0.0, end - max(frontier, start))
        dump.append(f"{start:.3f},{end:.3f},{added:.3f},\"{name[:120]}\"")
        by[c][0] += 1
        by[c][1] += end - start
        by[c][2] += added
        top[name[:80]][0] += 1
        top[name[:80]][1] += added
        frontier = max(frontier, end)
    with open(os.path.join(os.environ.get("OUT", "."), f"timeline_{bb}.csv"), "w") as f:
        f.write("\n".join(dump) + "\n")
    busy = sum(v[2] for v in by.values())
    print(f"\ngraph replay at {bb} row(s): {len(spans) / REPLAYS:.0f} kernels, {busy / REPLAYS:,.0f} us busy, "
          f"{(spans[-1][1] - spans[0][0]) / REPLAYS:,.0f} us from first start to last end, per frame")
    print("| class | kernels/frame | kernel us/frame | us added to the frame | us/kernel |")
    for c, (k, us, added) in sorted(by.items(), key=lambda kv: -kv[1][2]):
        print(f"| {c} | {k / REPLAYS:.0f} | {us / REPLAYS:,.0f} | {added / REPLAYS:,.0f} | {us / max(k, 1):.1f} |")
    for nm, (k, added) in sorted(top.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {added / REPLAYS:8.0f} us added  x{k / REPLAYS:<5.0f} {nm}")

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
