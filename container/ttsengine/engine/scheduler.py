"""Which sequences run in the next step. Pure Python: no torch, no device, easy to test.

A `Job` is one generation (one text chunk of a request). Running jobs occupy slots 0..B-1 with no
holes: when a job leaves, the job in the last slot moves into its place (the runner copies that
row's device state), so the batch bucket is always the smallest that covers B.

Admission is FIFO, bounded by free slots, free KV pages (each job reserves the pages its longest
possible sequence needs, so a running job never runs out) and a prefill token budget per step.
The waiting queue is bounded: a full engine refuses new work at once (BusyError), it never queues
without limit. Continuations of a long text go to the front: they already hold a client.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from ..errors import BusyError

_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    prompt_len: int
    max_frames: int  # frames to generate at most (the last generated one is dropped)
    owner: object = None  # whatever the engine uses to route this job's output
    stop_on_eos: bool = True
    id: int = field(default_factory=lambda: next(_ids))
    slot: int | None = None
    generated: int = 0  # frames generated so far, the prefill frame included
    cancelled: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "cancelled"

    @property
    def max_len(self) -> int:
        """Positions this job may write into the KV cache."""
        return self.prompt_len + self.max_frames


class Scheduler:
    def __init__(self, max_slots: int, max_queue: int, total_pages: int, page_size: int,
                 prefill_tokens: int):
        self.max_slots, self.max_queue = max_slots, max_queue
        self.total_pages, self.page_size = total_pages, page_size
        self.prefill_tokens = prefill_tokens
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # index = slot
        self.reserved_pages = 0

    # ---- queue --------------------------------------------------------------------------------
    def pages_for(self, job: Job) -> int:
        return -(-job.max_len // self.page_size)

    def submit(self, job: Job, front: bool = False) -> None:
        if self.pages_for(job) > self.total_pages:  # the planner's capacity guard lets no such request in
            raise ValueError(f"a job of {job.max_len} KV positions can never be admitted: the cache holds "
                             f"{self.total_pages * self.page_size}")
        if front:
            self.waiting.appendleft(job)
            return
        if len(self.waiting) >= self.max_queue:
            raise BusyError(f"the engine is busy ({len(self.running)} streams running, {len(self.waiting)} "
                            "waiting); retry shortly")
        self.waiting.append(job)

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- per step -----------------------------------------------------------------------------
    def admit(self) -> list[Job]:
        """Moves waiting jobs into free slots, FIFO; stops at the first that does not fit (no
        overtaking, so a large request cannot starve). At least one job per call if a slot and its
        pages are free, even past the prefill token budget."""
        admitted: list[Job] = []
        tokens = 0
        while self.waiting and len(self.running) < self.max_slots:
            job = self.waiting[0]
            if job.cancelled:
                self.waiting.popleft()
                job.finish_reason = "cancelled"
                continue
            pages = self.pages_for(job)
            if self.reserved_pages + pages > self.total_pages:
                break
            if admitted and tokens + job.prompt_len > self.prefill_tokens:
                break
            self.waiting.popleft()
            self.reserved_pages += pages
            tokens += job.prompt_len
            job.slot = len(self.running)
            self.running.append(job)
            admitted.append(job)
        return admitted

    def record_frames(self, token0: list[int], eos_id: int) -> list[Job]:
        """token0[slot] of the frame each running job just generated -> the jobs that finished."""
        done = []
        for job, tok in zip(self.running, token0):
            job.generated += 1
            if job.cancelled:
                job.finish_reason = "cancelled"
            elif job.stop_on_eos and tok == eos_id and job.generated > 1:  # never on the prefill frame
                job.finish_reason = "stop"
            elif job.generated >= job.max_frames:
                job.finish_reason = "length"
            if job.finish_reason:
                done.append(job)
        return done

    def cancel_waiting(self) -> list[Job]:
        """Drops cancelled jobs that never started."""
        dropped = [j for j in self.waiting if j.cancelled]
        for j in dropped:
            self.waiting.remove(j)
            j.finish_reason = "cancelled"
        return dropped

    def release(self, jobs: list[Job]) -> list[tuple[int, int]]:
        """Frees the slots of finished jobs; returns the (from, to) slot moves that keep 0..B-1 dense."""
        moves = []
        for job in sorted(jobs, key=lambda j: j.slot, reverse=True):
            slot, last = job.slot, len(self.running) - 1
            if slot != last:
                mover = self.running[last]
                self.running[slot] = mover
                mover.slot = slot
                moves.append((last, slot))
            self.running.pop()
            self.reserved_pages -= self.pages_for(job)
            job.slot = None
        return moves
