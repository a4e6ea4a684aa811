"""How a burst's planning fares beside a busy engine loop in one process (issue 43: the engine process's threads
share the GIL): 256 requests planned on 8 threads (the engine process's submit pool) while one thread runs small
torch ops and Python (a stand-in for the loop), CPU engine on the tiny test checkpoint. Prints, over TRIALS bursts,
the planning makespan and the stand-in loop's iterations per second meanwhile (higher: the loop was held up less).
A/B: run it on two checkouts, in the same minute (a busy machine moves both).
Usage: PYTHONPATH=container:. python scripts/plan_contention.py [trials]   (default 8)"""
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ttsengine import Engine, EngineConfig, SynthesisRequest
from ttsengine.tools.bench import TEXT

CHECKPOINT = Path(__file__).resolve().parents[1] / "tests" / "assets" / "golden" / "checkpoint"


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    torch.set_num_threads(1)
    engine = Engine.load(EngineConfig(model_dir=CHECKPOINT, device="cpu", max_batch=8))
    planner = engine.planner
    stop, count = threading.Event(), [0]

    def plan(request):
        planner.chunk_prompt(planner.plan(request, None), 0, None)

    def loop():
        a = torch.zeros(64)
        while not stop.is_set():
            for _ in range(20):
                a = a + 1  # a torch op: releases the GIL
            sum(range(200))  # Python: holds it
            count[0] += 1

    spans, rates = [], []
    for trial in range(trials):
        requests = [SynthesisRequest(text=f"{TEXT} {trial} {i}", seed=i, max_new_tokens=192) for i in range(256)]
        stop.clear()
        thread = threading.Thread(target=loop)
        thread.start()
        time.sleep(0.1)
        c0, t0 = count[0], time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            for f in [pool.submit(plan, r) for r in requests]:
                f.result()
        t1, c1 = time.perf_counter(), count[0]
        stop.set()
        thread.join()
        spans.append((t1 - t0) * 1e3)
        rates.append((c1 - c0) / (t1 - t0))
    t0 = time.perf_counter()
    for r in requests:
        plan(r)
    alone = (time.perf_counter() - t0) / len(requests) * 1e3
    print(f"planning alone {alone:.3f} ms a request; 256 on 8 threads beside the loop: makespan median "
          f"{statistics.median(spans):.0f} ms (min {min(spans):.0f}, max {max(spans):.0f}), the loop "
          f"{statistics.median(rates):.0f} iterations/s (median of {trials})")
    engine.close()


if __name__ == "__main__":
    main()
