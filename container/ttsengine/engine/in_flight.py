"""A decode step on its way back to the host: the pinned copy of its frames, the event that says the copy landed,
and which job made each row.

With TTS_OVERLAP_STEP (engine._iteration) the engine queues step k+1 on the GPU before it reads step k, so the GPU
never waits while the host records frames, finishes streams and feeds the codec. Rows are read by who made them
at launch: slots may have moved since, and a job that finished in step k made a frame in step k+1 that is not its
own (it is dropped; its KV position is inside the job's reservation, scheduler.Job.max_len).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .scheduler import Job


@dataclass
class InFlight:
    makers: list[Job | None]  # per row: the job whose frame the step makes, None for a row that makes none
    host: Tensor  # int64 [B, n+1], pinned on CUDA: the step's frames once `event` completed
    event: torch.cuda.Event | None  # recorded after the copy (None on CPU: the copy was synchronous)
    bucket: int  # the batch bucket it ran at
    prefill_tokens: int  # prompt tokens prefilled in the same iteration (the prefill budget's observation)
    started: float  # perf_counter at the start of its iteration

    def frames(self) -> np.ndarray:
        """Waits for the step (the host's only sync per step) -> int64 [B, n+1]."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.numpy().copy()

    def ahead(self) -> set[int]:
        """ids of the jobs this step makes a frame for: a step launched behind it writes their next position."""
        return {id(job) for job in self.makers if job is not None}
