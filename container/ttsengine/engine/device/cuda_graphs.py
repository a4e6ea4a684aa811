"""CUDA graphs of one kind of work (the decode step, the codec's chunk decode), keyed by shape.

A key's life: planned -> captured, or failed (it then runs uncaptured: a missing graph costs speed,
never service). Two ways to capture:
- `capture(keys)` while nothing else runs on the work's state (warm-up, or the engine idle): the
  body runs twice on the static inputs (lazy init, kernel selection), then the graph is recorded;
- `run(key, *inputs)` of a planned key not captured yet: the real work runs uncaptured (it is that
  shape's warm-up), then the graph is recorded; recording executes nothing, so no state moves twice.
Lazy start-up captures the smallest keys before ready and the rest with `capture_next` while idle.
Captures hold `lock`, which the engine shares between the decode step's and the codec's graphs so
that only one capture runs at a time (they come from two threads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger(__name__)
# One capture at a time in the whole process, for every engine in it: cuDNN's autotune flag (turned on inside the
# codec's capture windows) is process-wide, so a capture or tuned run under one engine's lock broke another engine's
# capture when each had a lock of its own (an idle engine's lazy codec capture beside a second engine's warm-up).
PROCESS_CAPTURE_LOCK = threading.RLock()


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]  # static inputs, copied into before each replay
    output: Tensor  # static output


class GraphSet:
    def __init__(self, kind: str, lock: threading.Lock, body: Callable[..., Tensor],
                 static_inputs: Callable[[Hashable], tuple[Tensor, ...]] = lambda key: (),
                 capture_on_current_stream: bool = False,
                 tune: Callable[[], AbstractContextManager] = contextlib.nullcontext,
                 gate: threading.Event | None = None):
        """body(key, *inputs) -> output does the work; static_inputs(key) makes inputs that are safe to run
        on (scratch rows) and become the graph's static inputs. capture_on_current_stream: record on the
        caller's stream (a worker thread's own stream) instead of torch's capture stream. tune(): a context
        around every first run and recording, inside the lock (the codec's cuDNN autotuning). gate: while set and
        clear, run() captures nothing (below)."""
        self.kind, self.lock, self.body, self.static_inputs = kind, lock, body, static_inputs
        self.tune = tune
        self.current_stream = capture_on_current_stream
        self.planned: list[Hashable] = []
        self.graphs: dict[Hashable, Captured] = {}
        self.failed: set[Hashable] = set()
        self._pool = None
        self._stream: torch.cuda.Stream | None = None  # this set's capture stream, on its thread's device
        # while set and clear, run() captures nothing (a fleet's other engines are still compiling: a capture
        # beside another thread's compile on another device failed with "operation not permitted")
        self.gate = gate

    def plan(self, keys: list) -> None:
        """The keys that get graphs (sorted: smallest first); forgets earlier graphs."""
        self.planned, self.graphs, self.failed = sorted(keys), {}, set()

    @property
    def pending(self) -> list:
        """Planned keys without a graph yet, smallest first."""
        return [k for k in self.planned if k not in self.graphs and k not in self.failed]

    def capture(self, keys: list | None = None) -> int:
        """Captures `keys` (default: all pending) -> how many. Nothing else may touch the work's state."""
        pending = self.pending
        todo = sorted((k for k in (pending if keys is None else keys) if k in pending), reverse=True)
        if not todo:  # largest first: the smaller graphs reuse its memory pool
            return 0
        t0 = time.perf_counter()
        with self.lock, self.tune():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for key in todo:
                    inputs = self.static_inputs(key)
                    for _ in range(2):
                        self.body(key, *inputs)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.current_stream().synchronize()
            t1 = time.perf_counter()
            for key in todo:
                self.graphs[key] = self._record(key)
            torch.cuda.current_stream().synchronize()
        # the split says where a start's capture time goes (issue 44): the bodies' first runs (compiles, cuDNN
        # plans, allocations) or the recordings. Measured, the first runs lead by far, and recording without
        # torch.cuda.graph's sync and cache emptying saved nothing (docs/performance.md, "Start time and kernel cache")
        t2 = time.perf_counter()
        log.info("captured %d %s graph(s) (%s) in %.2f s (first runs %.2f s, recording %.2f s)", len(todo), self.kind,
                 ", ".join(map(str, todo[::-1])), t2 - t0, t1 - t0, t2 - t1)
        return len(todo)

    def capture_next(self, keys: list | None = None) -> None:
        """Captures `keys` (default: the smallest pending); a failure leaves every pending key uncaptured,
        logged once: they run as plain work."""
        try:
            self.capture(self.pending[:1] if keys is None else keys)
        except Exception as e:  # noqa: BLE001 - a missing graph costs speed, not service
            log.warning("capturing %s graphs failed (%s: %s); %s run uncaptured", self.kind, type(e).__name__, e,
                        self.pending)
            self.failed.update(self.pending)

    def run(self, key: Hashable, *inputs: Tensor) -> Tensor:
        """The work of `key` on `inputs`: a replay, or the work itself followed by recording its graph
        when `key` is planned."""
        captured = self.graphs.get(key)
        if captured is not None:
            for static, value in zip(captured.inputs, inputs):
                static.copy_(value)
            captured.graph.replay()
            return captured.output
        if key not in self.planned or key in self.failed or (self.gate is not None and not self.gate.is_set()):
            return self.body(key, *inputs)
        t0 = time.perf_counter()
        with self.lock, self.tune():  # a first run may autotune or allocate: never while the other thread captures
            out = self.body(key, *inputs)
            try:
                self.graphs[key] = self._record(key)
            except Exception as e:  # noqa: BLE001 - the work itself ran; only its replay is lost
                log.warning("capturing the %s graph %s failed (%s: %s); it runs uncaptured", self.kind, key,
                            type(e).__name__, e)
                self.failed.add(key)
                return out
        log.info("captured the %s graph %s at first use in %.2f s", self.kind, key, time.perf_counter() - t0)
        return out

    def _record(self, key: Hashable) -> Captured:
        """Records (executes nothing) the work of `key` on fresh static inputs."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        inputs = self.static_inputs(key)
        graph = torch.cuda.CUDAGraph()
        if self._stream is None:  # not torch's class-wide default capture stream: that one lives on the device
            self._stream = torch.cuda.Stream()  # current when first used, wrong for the other engines of a fleet
        stream = torch.cuda.current_stream() if self.current_stream else self._stream
        # thread_local: the other thread (engine loop / codec worker) may be running work meanwhile
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            output = self.body(key, *inputs)
        return Captured(graph, inputs, output)
