"""CUDA graphs of the decode step, one per batch bucket, captured at warm-up while every slot is idle
(idle rows write only to the scratch page and keep their state, so capture changes nothing).
Capture and replay happen on the engine thread."""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from .runner import Runner

log = logging.getLogger(__name__)


class StepGraphs:
    def __init__(self, runner: Runner, settings):
        self.runner = runner
        self.buckets = settings.buckets
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}

    def capture(self) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for bb in reversed(self.buckets):  # largest first, so smaller graphs reuse its memory
                for _ in range(2):  # warm-up: lazy init, kernel selection
                    self.runner.decode_step(bb)
        torch.cuda.current_stream().wait_stream(side)
        for bb in reversed(self.buckets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[bb] = self.runner.decode_step(bb)
            self.graphs[bb] = g
        torch.cuda.synchronize()
        log.info("captured %d decode-step graphs (batch %s) in %.1f s", len(self.graphs),
                 ",".join(map(str, self.buckets)), time.perf_counter() - t0)

    def run(self, bb: int) -> Tensor:
        """Replays bucket bb's step (bb from BatchSettings.bucket)."""
        self.graphs[bb].replay()
        return self.outputs[bb]
