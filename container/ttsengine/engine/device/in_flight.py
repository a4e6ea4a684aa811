"""A decode step on its way back to the host: the pinned copy of its frames, the event that says the copy landed,
and which job made each row.

With overlap_step (engine._iteration) the engine queues step k+1 on the GPU before it reads step k, so the GPU
never waits while the host records frames, finishes streams and feeds the codec. Rows are read by who made them
at launch: slots may have moved since, and a job that finished in step k made a frame in step k+1 that is not its
own (it is dropped; its KV position is inside the job's reservation, scheduler.Job.max_len).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..control.scheduler import Job


@dataclass
class InFlight:
    makers: list[Job | None]  # per row: the job whose frame the step makes, None for a row that makes none
    host: Tensor  # int64 [B, n+1], pinned on CUDA: the step's frames once `event` completed
    event: torch.cuda.Event | None  # recorded after the copy (None on CPU: the copy was synchronous)
    bucket: int  # the batch bucket it ran at
    prefill_tokens: int  # prompt tokens prefilled in the same iteration (the prefill budget's observation)
    started: float  # perf_counter at the start of its iteration
    begun: torch.cuda.Event | None = None  # timing event recorded before the iteration's prefill (overlapped steps)
    waited: float = 0.0  # seconds frames() waited for the step (host clock)

    def frames(self) -> np.ndarray:
        """Waits for the step (the host's only per-step wait) -> int64 [B, n+1]."""
        if self.event is not None:
            t0 = time.perf_counter()
            self.event.synchronize()
            self.waited = time.perf_counter() - t0
        return self.host.numpy().copy()

    def gpu_seconds(self) -> float | None:
        """The GPU's time from the iteration's prefill to the step's end (after frames()), or None when untimed:
        what the prefill budget sizes, whether the host or the GPU was the slower side of the overlap."""
        if self.begun is None or self.event is None:
            return None
        return self.begun.elapsed_time(self.event) / 1e3
