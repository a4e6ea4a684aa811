"""CUDA graphs of the decode step, one per batch bucket. Capture and replay happen on the engine thread.

A bucket is captured one of two ways:
- `capture(buckets)` while every slot is idle (warm-up, or the engine loop when it has nothing to do):
  two plain steps first (idle rows write only to the scratch page and keep their state, so they
  change nothing), then the capture;
- `run(bb)` of a bucket not captured yet: the real step runs uncaptured (it is also the warm-up of
  that shape), then the graph is recorded; recording executes nothing, so no row advances twice.
With `lazy` start-up (the default) only the smallest bucket is captured before the engine is ready;
the others follow while the engine is idle or at first use, which takes ~2.5 s off a warm start.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from torch import Tensor

from .runner import Runner

log = logging.getLogger(__name__)


class StepGraphs:
    def __init__(self, runner: Runner, settings, lock: threading.Lock | None = None):
        """lock: held while capturing; the engine shares it with the codec's captures (one at a time)."""
        self.runner = runner
        self.lock = lock or threading.Lock()
        self.buckets = settings.buckets
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}
        self._pool = None
        self.failed: set[int] = set()  # buckets whose capture failed: they run uncaptured

    @property
    def pending(self) -> list[int]:
        """Buckets without a graph yet, smallest first."""
        return [b for b in self.buckets if b not in self.graphs and b not in self.failed]

    def capture_next(self) -> None:
        """Captures the smallest pending bucket (every slot idle); a failure leaves the pending ones
        uncaptured (logged once), the engine keeps serving them as plain steps."""
        try:
            self.capture(self.pending[:1])
        except Exception as e:  # noqa: BLE001 - a missing graph costs speed, not service
            log.warning("capturing decode graphs failed (%s: %s); batches %s run uncaptured", type(e).__name__, e,
                        self.pending)
            self.failed.update(self.pending)

    def capture(self, buckets: list[int] | tuple[int, ...] | None = None) -> None:
        """Captures `buckets` (default: all pending). Every slot must be idle."""
        todo = sorted(self.pending if buckets is None else [b for b in buckets if b not in self.graphs],
                      reverse=True)  # largest first, so smaller graphs reuse its memory
        if not todo:
            return
        t0 = time.perf_counter()
        with self.lock:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for bb in todo:
                    for _ in range(2):  # warm-up: lazy init, kernel selection
                        self.runner.decode_step(bb)
            torch.cuda.current_stream().wait_stream(side)
            for bb in todo:
                self._record(bb)
            torch.cuda.synchronize()
        log.info("captured %d decode-step graph(s) (batch %s) in %.2f s", len(todo), ",".join(map(str, todo[::-1])),
                 time.perf_counter() - t0)

    def run(self, bb: int) -> Tensor:
        """Bucket bb's step (bb from BatchSettings.bucket): a replay, or the first real step of bb followed
        by recording its graph."""
        graph = self.graphs.get(bb)
        if graph is not None:
            graph.replay()
            return self.outputs[bb]
        out = self.runner.decode_step(bb)
        if bb in self.failed:
            return out
        t0 = time.perf_counter()
        try:
            with self.lock:
                self._record(bb)
        except Exception as e:  # noqa: BLE001 - the step itself ran; only its replay is lost
            log.warning("capturing the decode graph of batch %d failed (%s: %s); it runs uncaptured", bb,
                        type(e).__name__, e)
            self.failed.add(bb)
            return out
        log.info("captured the decode-step graph of batch %d at first use in %.2f s", bb, time.perf_counter() - t0)
        return out

    def _record(self, bb: int) -> None:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        # thread_local: the vocoder thread may be working on its own stream meanwhile
        with torch.cuda.graph(g, pool=self._pool, capture_error_mode="thread_local"):
            self.outputs[bb] = self.runner.decode_step(bb)
        self.graphs[bb] = g
