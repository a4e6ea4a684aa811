"""Where a warm-cache start spends its time: process start -> imports -> CUDA -> load -> each warm-up
phase (codec compile, codec graphs, decode compile, decode graphs), each phase under cProfile with
its top functions and dynamo's compile-time table. Run after a `warm` has filled --cache-dir.

    python3 scripts/device/coldstart_profile.py --cache-dir /tmp/kc [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

T = {}


def mark(name: str) -> None:
    from ttsengine.tools.warm import process_age

    T[name] = process_age()
    print(f"{T[name]:7.2f} s  {name}", flush=True)


def profiled(name: str, fn, top: int):
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    out = fn()
    prof.disable()
    print(f"--- {name}: {time.perf_counter() - start:.2f} s", flush=True)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top * 3)
    lines = [ln for ln in s.getvalue().splitlines() if "{" not in ln or "built-in" in ln]
    keep = [ln for ln in lines if ln.strip() and ln.strip()[0].isdigit()]
    print("\n".join(keep[:top]))
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print("  by own time:")
    print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip() and ln.strip()[0].isdigit()))
    mark(name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    mark("python up")
    import torch

    mark("import torch")
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    mark("CUDA context")
    from ttsengine.config import from_env
    from ttsengine.engine.engine import VOCODER_GRAPH_ROWS, Engine
    from ttsengine.engine.loader import load

    mark("import ttsengine")
    config = from_env(cache_dir=Path(args.cache_dir))
    ckpt = load(config, "s1-mini")
    torch.cuda.synchronize()
    mark("load (random weights)")
    engine = profiled("Engine()", lambda: Engine(ckpt, config), args.top)
    print(f"kernel cache {engine.kernel_cache.status}")
    side = torch.cuda.Stream()  # graphs are captured off the default stream, as the engine's threads do
    with torch.inference_mode(), torch.cuda.stream(side):
        profiled("codec compile (warm_up)", engine.vocoder.warm_up, args.top)
        engine.vocoder.plan_graphs(VOCODER_GRAPH_ROWS)
        profiled("codec graphs", engine.vocoder.capture, args.top)
        big = engine.settings.buckets[-1]  # (the engine compiles its warm_buckets; here the largest, whose units
        # are compiled ones: the one-row bucket's own variants then compile inside "decode graphs before ready")
        profiled("decode compile (1 step)", lambda: (engine.runner.decode_step(big), torch.cuda.synchronize()),
                 args.top)
        lazy = engine.settings.buckets[:1] if engine.settings.lazy_graphs else None  # device.py's before-ready set
        profiled("decode graphs before ready", lambda: engine.device.graphs.capture(lazy), args.top)
        profiled("decode graphs after ready", engine.device.graphs.capture, args.top)
    from torch._dynamo.utils import compile_times

    print(compile_times(repr="str"))
    engine.worker.close()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)7d ms %(name)s: %(message)s")
    main()
