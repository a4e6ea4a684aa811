"""Where one bench level's GPU time goes, per CUDA stream, from a kernel trace (torch profiler, CUDA activity only):
each stream's busy time, how much of it overlaps another stream's, the GPU's idle time, a timeline in bins, and
each stream's heaviest kernels. Answers: does the codec run beside the decode step or after it, what runs during a
burst's ramp, and is the GPU ever idle.

Wraps bench.run_level (nothing in the package changes) and profiles the level given by PROFILE_LEVEL (1-based,
default: the last), then runs `bench` with the given args.
Usage: PROFILE_LEVEL=3 python scripts/device/gpu_timeline.py --random-weights s1-mini --frames 192 \
           --concurrency 64,64,64 --out DIR          (env BIN_MS: the timeline's bin, default 50)
env DUMP=FILE.npz: also keep the raw trace (every kernel: stream, start, end, name; with HOST=1 also host ranges of
the wrapped methods, from CPU activity, which records every torch op too and slows the host a little) for offline
reading. Only the profiling thread's ranges come back (the submits): the engine's loop and codec threads, started
before the profiler, are not recorded (torch 2.11); scripts/device/ramp_trace.py and loop_trace.py time those.
"""
import os
import sys
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from ttsengine.engine import engine, fleet, vocoder
from ttsengine.synthesis import stream
from ttsengine.tools import bench

TRACES: list[tuple[int, float, list]] = []  # (concurrency, wall s, [(stream, start_ns, end_ns, name)])
_run_level = bench.run_level
_calls = [0]


def run_level(fleet_, concurrency, load, progress):
    _calls[0] += 1
    levels = len(os.environ.get("LEVELS", "").split(",")) if os.environ.get("LEVELS") else None
    target = int(os.environ.get("PROFILE_LEVEL", "0")) or levels
    if target is not None and _calls[0] != target:
        return _run_level(fleet_, concurrency, load, progress)
    host = os.environ.get("HOST") == "1"
    activities = [ProfilerActivity.CUDA] + [ProfilerActivity.CPU] * host
    with profile(activities=activities) as prof:
        out = _run_level(fleet_, concurrency, load, progress)
    torch.cuda.synchronize()
    events = prof.profiler.kineto_results.events()
    kernels = [(e.device_resource_id(), e.start_ns(), e.end_ns(), e.name())
               for e in events if e.device_type() == DeviceType.CUDA and e.duration_ns() > 0]
    TRACES.append((concurrency, out.wall_s, kernels))
    if os.environ.get("DUMP"):
        ranges = [(e.start_thread_id(), e.start_ns(), e.end_ns(), e.name()) for e in events
                  if e.device_type() == DeviceType.CPU and e.name().startswith("tl:")]
        _dump(os.environ["DUMP"], kernels, ranges)
    return out


def _dump(path: str, kernels: list, ranges: list) -> None:
    import numpy as np

    names = sorted({k[3] for k in kernels} | {r[3] for r in ranges})
    idx = {n: i for i, n in enumerate(names)}
    arr = lambda rows: np.array([(a, b, c, idx[n]) for a, b, c, n in rows], dtype=np.int64).reshape(-1, 4)  # noqa
    np.savez_compressed(path, kernels=arr(kernels), ranges=arr(ranges), names=np.array(names))
    print(f"trace: {len(kernels)} kernels, {len(ranges)} host ranges -> {path}")


def annotate(cls, name: str) -> None:
    fn = getattr(cls, name, None)
    if fn is None:  # an older tree
        return
    label = f"tl:{cls.__name__}.{name}"

    def wrapper(*a, **kw):
        with record_function(label):
            return fn(*a, **kw)

    setattr(cls, name, wrapper)


if os.environ.get("HOST") == "1":
    for cls, names in [(engine.Engine, ["_iteration", "_intake", "_prefill", "_launch", "_read", "_vocode",
                                        "_release"]),
                       (vocoder.Vocoder, ["_decode_deliver", "decode_padded", "_to_host", "_resets", "_finish"]),
                       (stream.Stream, ["emit"]), (fleet.Fleet, ["submit"])]:
        for n in names:
            annotate(cls, n)


bench.run_level = run_level


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals, lo: int | None = None, hi: int | None = None) -> int:
    total = 0
    for s, e in intervals:
        if lo is not None:
            s, e = max(s, lo), min(e, hi)
        total += max(0, e - s)
    return total


def _intersect(a, b) -> list[tuple[int, int]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summary(bin_ms: float) -> None:
    for concurrency, wall, kernels in TRACES:
        if not kernels:
            print(f"level {concurrency}: no kernels traced")
            continue
        t0, t1 = min(k[1] for k in kernels), max(k[2] for k in kernels)
        by_stream: dict[int, list] = defaultdict(list)
        for k in kernels:
            by_stream[k[0]].append(k)
        streams = sorted(by_stream, key=lambda s: -sum(k[2] - k[1] for k in by_stream[s]))
        busy = {s: _union([(k[1], k[2]) for k in by_stream[s]]) for s in streams}
        anyb = _union([iv for s in streams for iv in busy[s]])
        span, used = (t1 - t0) / 1e6, _length(anyb) / 1e6
        print(f"\n=== level {concurrency} streams: bench wall {wall:.3f} s; traced kernels {len(kernels)} over "
              f"{span:.1f} ms; GPU busy {used:.1f} ms, idle {span - used:.1f} ms")
        print(f"{'stream':>8} {'kernels':>8} {'busy ms':>9} {'overlapped ms':>14}")
        for s in streams:
            others = _union([iv for o in streams if o != s for iv in busy[o]])
            print(f"{s:>8} {len(by_stream[s]):>8} {_length(busy[s]) / 1e6:>9.1f} "
                  f"{_length(_intersect(busy[s], others)) / 1e6:>14.1f}")
        top = streams[:2]
        print(f"timeline, {bin_ms:.0f} ms bins: busy ms of stream {top[0]}"
              + (f" / stream {top[1]} / both / idle" if len(top) > 1 else " / idle"))
        both = _intersect(busy[top[0]], busy[top[1]]) if len(top) > 1 else []
        step = int(bin_ms * 1e6)
        rows = []
        for lo in range(t0, t1, step):
            hi = lo + step
            cells = [_length(busy[s], lo, hi) / 1e6 for s in top]
            if len(top) > 1:
                cells.append(_length(both, lo, hi) / 1e6)
            cells.append((min(hi, t1) - lo - _length(anyb, lo, hi)) / 1e6)
            rows.append(f"{(lo - t0) / 1e6:>6.0f}: " + " / ".join(f"{c:5.1f}" for c in cells))
        print("\n".join(rows))
        for s in top:
            agg: dict[str, list] = defaultdict(lambda: [0, 0])
            for k in by_stream[s]:
                a = agg[k[3][:90]]
                a[0] += 1
                a[1] += k[2] - k[1]
            print(f"stream {s}: heaviest kernels (count, total ms, mean us)")
            for name, (n, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
                print(f"  {n:>7} {ns / 1e6:>8.1f} {ns / n / 1e3:>8.1f}  {name}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--concurrency" in argv:
        os.environ.setdefault("LEVELS", argv[argv.index("--concurrency") + 1])
    rc = bench.main(argv)
    summary(float(os.environ.get("BIN_MS", "50")))
    sys.exit(rc)
