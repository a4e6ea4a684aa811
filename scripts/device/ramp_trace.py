"""How a burst of requests gets in: per engine-loop iteration of the last bench level, its start, the streams running,
the prefill budget asked, the chunks scheduled (new prompts / continuations, positions) and the prefill calls made
(their graph keys). Wraps the engine's methods (nothing in the package changes), then runs `bench` with the args.
Usage: python scripts/device/ramp_trace.py --random-weights s1-mini --frames 192 --concurrency 64,64 [N]
(env ITERATIONS: how many iterations to print, default 24)
"""
import os
import sys
import time

from ttsengine.engine import engine
from ttsengine.engine.control import prefill_budget, scheduler
from ttsengine.engine.device import runner
from ttsengine.tools import bench

LOG: list[tuple] = []  # (kind, time, payload)
LEVELS: list[tuple[float, float]] = []


def wrap(cls, name, record):
    fn = getattr(cls, name)

    def wrapper(*a, **kw):
        out = fn(*a, **kw)
        LOG.append((name, time.perf_counter(), record(a, kw, out)))
        return out

    setattr(cls, name, wrapper)


def _before_iteration(self):
    LOG.append(("iteration", time.perf_counter(), len(self.scheduler.running)))
    return _iteration(self)


_iteration = engine.Engine._iteration
engine.Engine._iteration = _before_iteration
wrap(prefill_budget.PrefillBudget, "tokens", lambda a, kw, out: (a[1], out))
wrap(scheduler.Scheduler, "schedule", lambda a, kw, out: [(c.start, c.tokens) for c in out.chunks])
wrap(runner.Runner, "prefill_key", lambda a, kw, out: out)
_run_level = bench.run_level


def run_level(fleet_, concurrency, load, progress):
    t0 = time.perf_counter()
    out = _run_level(fleet_, concurrency, load, progress)
    LEVELS.append((t0, t0 + out.wall_s))
    return out


bench.run_level = run_level


def summary(n: int) -> None:
    t0, t1 = LEVELS[-1]
    rows, cur = [], None
    for kind, t, payload in LOG:
        if not t0 <= t <= t1:
            continue
        if kind == "iteration":
            cur = {"t": t - t0, "running": payload, "budget": [], "new": 0, "cont": 0, "tokens": 0, "keys": []}
            rows.append(cur)
        elif cur is None:
            continue
        elif kind == "tokens":
            cur["budget"].append(payload)
        elif kind == "schedule":
            cur["new"] += sum(1 for s, _ in payload if s == 0)
            cur["cont"] += sum(1 for s, _ in payload if s > 0)
            cur["tokens"] += sum(k for _, k in payload)
        elif kind == "prefill_key":
            cur["keys"].append(payload)
    print(f"last level: {len(rows)} iterations over {1e3 * (t1 - t0):.0f} ms")
    print(f"{'ms':>7} {'run':>4} {'new':>4} {'cont':>4} {'tok':>5}  budget (bucket, tokens) ...  prefill keys")
    for r in rows[:n]:
        budget = sorted(set(r["budget"]))[:3]
        print(f"{1e3 * r['t']:7.1f} {r['running']:>4} {r['new']:>4} {r['cont']:>4} {r['tokens']:>5}  {budget}  "
              f"{r['keys']}")


if __name__ == "__main__":
    rc = bench.main(sys.argv[1:])
    summary(int(os.environ.get("ITERATIONS", "24")))
    sys.exit(rc)
