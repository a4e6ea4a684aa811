"""Where a bench level's wall time goes on the host: the engine loop's phases, the codec thread's, the submitting
thread's, each as wall and thread-CPU seconds (wall well above CPU in a pure-Python phase: it waited for the GIL or
for a blocking CUDA call), and the parts of the level outside the loop's iterations (start, tail).

Wraps the engine's methods with timers (nothing in the package changes), then runs `bench` with the given args.
Usage: python scripts/device/loop_trace.py --random-weights s1-mini --frames 192 --concurrency 64,64 --out DIR
"""
import functools
import statistics
import sys
import threading
import time
from collections import defaultdict

from ttsengine.engine import audio_feed, engine, fleet
from ttsengine.engine.control import scheduler
from ttsengine.engine.device import cuda_graphs, device, in_flight, runner, vocoder
from ttsengine.synthesis import stream
from ttsengine.tools import bench

EVENTS: list[tuple[str, str, float, float, float]] = []  # (thread, name, start, wall, cpu)
LEVELS: list[tuple[int, float, float]] = []  # (concurrency, start, end)


def timed(cls, name: str, label: str | None = None) -> None:
    fn = getattr(cls, name)
    label = label or f"{cls.__name__}.{name}"

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            EVENTS.append((threading.current_thread().name, label, t0, time.perf_counter() - t0,
                           time.thread_time() - c0))

    setattr(cls, name, wrapper)


for cls, names in [(engine.Engine, ["_iteration", "_intake", "_cancellations", "_read", "_finished"]),
                   (audio_feed.AudioFeed, ["due", "send"]),
                   (scheduler.Scheduler, ["schedule", "update"]),
                   (device.Device, ["execute"]),
                   (runner.Runner, ["prefill", "write_table"]),
                   (in_flight.InFlight, ["frames"]),
                   (cuda_graphs.GraphSet, ["run"]),
                   (vocoder.Vocoder, ["_decode_deliver", "decode_padded", "decode"]),
                   (audio_feed.CodecRounds, ["due"]),
                   (stream.Stream, ["emit"]),
                   (fleet.Fleet, ["submit"])]:
    for n in names:
        timed(cls, n)

_run_level = bench.run_level


def run_level(fleet_, concurrency, load, progress):
    t0 = time.perf_counter()
    out = _run_level(fleet_, concurrency, load, progress)
    LEVELS.append((concurrency, t0, t0 + out.wall_s))
    return out


bench.run_level = run_level


def summary() -> None:
    for concurrency, start, end in LEVELS:
        ev = [e for e in EVENTS if start <= e[2] < end]
        print(f"\n=== level {concurrency} streams: wall {end - start:.3f} s "
              f"({concurrency * (FRAMES - 1) / (end - start):,.0f} frames/s) ===")
        agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for th, name, _, wall, cpu in ev:
            a = agg[(th.split("-")[0] if th.startswith("Thread") else th, name)]
            a[0] += 1
            a[1] += wall
            a[2] += cpu
            a[3] = max(a[3], wall)
        print(f"{'thread':<16} {'phase':<30} {'calls':>6} {'wall s':>8} {'cpu s':>8} {'mean ms':>8} {'max ms':>8}")
        for (th, name), (n, wall, cpu, mx) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
            print(f"{th[:16]:<16} {name[:30]:<30} {n:>6} {wall:>8.3f} {cpu:>8.3f} {1e3 * wall / n:>8.3f} "
                  f"{1e3 * mx:>8.2f}")
        its = sorted((e for e in ev if e[1] == "Engine._iteration"), key=lambda e: e[2])
        if not its:
            continue
        waits = sorted((e for e in ev if e[1] == "InFlight.frames"), key=lambda e: e[2])
        first, last = its[0][2], its[-1][2] + its[-1][3]
        subs = [e for e in ev if e[1] == "Fleet.submit"]
        emits = sorted(e[2] for e in ev if e[1] == "Stream.emit")
        print(f"submits {len(subs)}: {1e3 * (min(e[2] for e in subs) - start):.1f} -> "
              f"{1e3 * (max(e[2] + e[3] for e in subs) - start):.1f} ms; first iteration at "
              f"{1e3 * (first - start):.1f} ms, last ends {1e3 * (last - start):.1f} ms, level ends "
              f"{1e3 * (end - start):.1f} ms; first emit {1e3 * (emits[0] - start):.1f}, last emit "
              f"{1e3 * (emits[-1] - start):.1f} ms")
        gaps = [b[2] - (a[2] + a[3]) for a, b in zip(its, its[1:])]
        host = []
        wi = 0
        for e in its:  # the iteration's time less its wait for the step
            w = 0.0
            while wi < len(waits) and waits[wi][2] < e[2] + e[3]:
                if waits[wi][2] >= e[2]:
                    w += waits[wi][3]
                wi += 1
            host.append((e[3] - w, w, e[3]))
        hs = sorted(h[0] for h in host)
        print(f"iterations {len(its)}: sum {sum(e[3] for e in its):.3f} s, between them {sum(gaps):.3f} s "
              f"(max {1e3 * max(gaps, default=0):.2f} ms); host p50 {1e3 * hs[len(hs) // 2]:.2f} p90 "
              f"{1e3 * hs[int(len(hs) * 0.9)]:.2f} max {1e3 * hs[-1]:.2f} ms; waits sum "
              f"{sum(h[1] for h in host):.3f} s")
        print("first 12 / last 6 iterations (host ms, wait ms):",
              [(round(1e3 * h, 1), round(1e3 * w, 1)) for h, w, _ in host[:12]], "...",
              [(round(1e3 * h, 1), round(1e3 * w, 1)) for h, w, _ in host[-6:]])
        print("wait ms p50 by position:", round(1e3 * statistics.median(h[1] for h in host), 2))


FRAMES = 192
if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--frames" in argv:
        FRAMES = int(argv[argv.index("--frames") + 1])
    rc = bench.main(argv)
    summary()
    sys.exit(rc)
