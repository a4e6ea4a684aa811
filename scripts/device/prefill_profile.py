"""Where one request's prefill goes (real S1-mini shapes, random weights): wall time with a sync, GPU time,
kernel count, and the top CPU ops / GPU kernels. Usage: python3 scripts/device/prefill_profile.py"""
import time

import torch

from ttsengine.config import from_env
from ttsengine.engine.control.page_pool import PagePool
from ttsengine.engine.device.runner import PrefillItem
from ttsengine.engine.engine import Engine
from ttsengine.engine.loader import load
from ttsengine.synthesis.request import SynthesisRequest

engine = Engine(load(from_env(max_batch=8), "s1-mini"), from_env(max_batch=8))
engine.start()
engine.submit(SynthesisRequest(text="Warm up.", seed=0, max_new_tokens=8), ignore_stop=True).result()
r = engine.runner
n = engine.ckpt.config.num_codebooks
pool = PagePool(r.cfg.num_pages, r.cfg.max_slots, r.cfg.page_size)  # this script's own pages (the engine is idle)


def item(T, slot=7):
    pool.grow(slot, T - 1)
    prompt = torch.randint(0, 1000, (n + 1, T))
    return PrefillItem(slot, prompt, (0.8, 0.8, 1.1, 1), 0, pages=tuple(pool.slot_pages[slot]))


def timed(g, T, reps=5):
    items = [item(T, slot) for slot in range(g)]
    with torch.inference_mode():
        r.prefill(items)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            r.prefill(items)
        host = (time.perf_counter() - t0) / reps
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / reps
    for it in items:
        pool.release(it.slot)
    return host, wall


engine.close()
for g, T in ((1, 45), (1, 300), (8, 45), (8, 300)):
    host, wall = timed(g, T)
    print(f"prefill g={g} T={T}: host {host * 1e3:.1f} ms, with sync {wall * 1e3:.1f} ms", flush=True)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, torch.inference_mode():
    r.prefill([item(45)])
    torch.cuda.synchronize()
ev = prof.key_averages()
gpu = sorted(ev, key=lambda e: e.self_device_time_total, reverse=True)
print("GPU kernels:", sum(e.count for e in ev if e.self_device_time_total > 0), "total ms",
      round(sum(e.self_device_time_total for e in ev) / 1e3, 2))
for e in gpu[:10]:
    print(f"  GPU {e.self_device_time_total / 1e3:8.3f} ms x{e.count:<5} {e.key[:80]}")
for e in sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]:
    print(f"  CPU {e.self_cpu_time_total / 1e3:8.3f} ms x{e.count:<5} {e.key[:80]}")
