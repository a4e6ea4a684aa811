"""Where test_int8_graphs_equal_eager_tokens_bf16's mismatch comes from (tests/engine/test_gpu.py; stop 62: it
fails with the tile and fused int8 kernels, passes with dequant, and the Triton kernel alone is row-independent).
Each of the test's requests alone, then all four at once, graphed against eager, per int8 kernel: equal alone but not
together points at batching (row counts, prefill grouping), unequal alone at an op that differs inside a graph.
Stop 63 found: each alone equal, all four differ (request 0, frame 38 of 40) in every graphed run, eager runs agree
with each other whatever their schedule. VARIANTS="-lazy_graphs -prefill_fit ..." then runs only the four at once,
graphed with each TTS_FEATURES variant added, against one eager run: the variant whose row says equal names the part.
Usage (device): PYTHONPATH=$PWD/container:$PWD:$PWD/tests python3 scripts/device/int8_graphs_check.py [KERNEL...]
  (env VARIANTS: space-separated feature lists, e.g. "-lazy_graphs -prefill_fit,-slack_prefill")"""

import os
import sys

import numpy as np

sys.path[:0] = ["tests", "tests/engine"]
from test_gpu import REQUESTS, cfg, tokens  # noqa: E402


def same(a: list, b: list) -> bool:
    return all(len(g) == len(e) and all(np.array_equal(x, y) for x, y in zip(g, e)) for g, e in zip(a, b))


def first_difference(a: list, b: list) -> str:
    """'request r, chunk c, frame f' of the first frame that differs (or a length mismatch)."""
    for r, (g, e) in enumerate(zip(a, b)):
        for c, (x, y) in enumerate(zip(g, e)):
            if x is None or y is None or x.shape != y.shape:
                return f"request {r}, chunk {c}: shapes {getattr(x, 'shape', None)} / {getattr(y, 'shape', None)}"
            rows = np.nonzero((x != y).any(axis=1))[0]
            if len(rows):
                return f"request {r}, chunk {c}, frame {rows[0]} of {len(x)}"
    return "none"


variants = os.environ.get("VARIANTS", "").split()
for kernel in sys.argv[1:] or ["tile", "dequant"]:
    if variants:
        eager = tokens(cfg(features="-cuda_graphs,-compile", quant="int8", int8_kernel=kernel))
        for v in variants:
            graphed = tokens(cfg(features=f"+cuda_graphs,-compile,{v}", quant="int8", int8_kernel=kernel))
            print(f"| {kernel} | all four, graphed {v} | {'equal' if same(graphed, eager) else 'differs'} | "
                  f"{first_difference(graphed, eager)} |", flush=True)
        continue
    for label, waves in [(f"request {i} alone", ([q],)) for i, q in enumerate(REQUESTS)] + [("all four", (REQUESTS,))]:
        eager = tokens(cfg(features="-cuda_graphs,-compile", quant="int8", int8_kernel=kernel), waves=waves)
        graphed = tokens(cfg(features="+cuda_graphs,-compile", quant="int8", int8_kernel=kernel), waves=waves)
        print(f"| {kernel} | {label} | {'equal' if same(graphed, eager) else 'differs'} | "
              f"{first_difference(graphed, eager)} |", flush=True)
