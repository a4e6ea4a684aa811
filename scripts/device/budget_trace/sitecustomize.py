"""The prefill budget's every decision and timing, in whatever process runs the engine (the engine process of a
server included), for issue 44's burst at /ready: a directory on PYTHONPATH makes Python import this at start-up.
With BUDGET_TRACE=FILE set, PrefillBudget.tokens and .observe are wrapped; each call appends a JSON line to FILE.pid
(written in batches, and at exit): ["t", time.monotonic()], ["tokens", bucket, slack, budget] or
["observe", bucket, prefilled, seconds, the bucket's step time, seconds per position, the fitted cost], and
["gc", generation, seconds, objects collected] for each of the garbage collector's passes of generation 2 or of 2 ms
and more (a full pass over a heap of torch's objects holds the GIL every thread of the process needs). The front
process of a server writes its own FILE.pid too (its collections only).
Nothing in the package changes; without BUDGET_TRACE this does nothing. Read by scripts/device/budget_table.py.
Usage: PYTHONPATH=scripts/device/budget_trace:$PYTHONPATH BUDGET_TRACE=/tmp/budget python3 -m handlers http"""

import atexit
import contextlib
import functools
import gc
import json
import os
import threading
import time

_PATH = os.environ.get("BUDGET_TRACE")


def _install(path: str) -> None:
    from ttsengine.engine.control import prefill_budget

    lines: list[str] = []
    lock = threading.Lock()
    out = f"{path}.{os.getpid()}"

    def flush() -> None:
        with lock:
            if lines:
                with open(out, "a") as f:
                    f.write("".join(lines))
                lines.clear()

    def record(row: list) -> None:
        with lock:
            lines.append(json.dumps([round(time.monotonic(), 4), *row]) + "\n")
            full = len(lines) >= 200
        if full:
            flush()

    budget = prefill_budget.PrefillBudget
    tokens, observe = budget.tokens, budget.observe

    @functools.wraps(tokens)
    def traced_tokens(self, bucket, slack=0.0):
        n = tokens(self, bucket, slack)
        record(["tokens", bucket, round(slack, 4), n])
        return n

    @functools.wraps(observe)
    def traced_observe(self, bucket, prefilled, seconds):
        observe(self, bucket, prefilled, seconds)
        record(["observe", bucket, prefilled, round(seconds, 5), self.step_seconds.get(bucket), self.token_seconds,
                self.cost])

    def every_second() -> None:  # a server ended by a signal may never run atexit
        while True:
            time.sleep(1.0)
            flush()

    began = [0.0]

    def collection(phase: str, info: dict) -> None:  # gc.callbacks: in the thread that triggered the pass
        if phase == "start":
            began[0] = time.perf_counter()
            return
        took = time.perf_counter() - began[0]
        if info["generation"] == 2 or took >= 0.002:
            record(["gc", info["generation"], round(took, 5), info["collected"]])

    budget.tokens, budget.observe = traced_tokens, traced_observe
    gc.callbacks.append(collection)
    atexit.register(flush)
    threading.Thread(target=every_second, daemon=True, name="budget-trace").start()


if _PATH:
    with contextlib.suppress(ImportError):  # a process without the package on its path (a tool, pip): no trace
        _install(_PATH)
