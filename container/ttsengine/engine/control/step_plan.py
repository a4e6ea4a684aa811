"""The one object between the control plane and the device plane: what the device does in one engine iteration.

The scheduler makes a StepPlan (Scheduler.schedule) from host-side state alone; the device plane carries it out in
order (device/device.py: execute(plan)) and never decides anything itself:
1. slot_ops: the row moves and resets that releases left (a finished job's slot takes the last running job's row, so
   slots stay 0..B-1 dense; freed rows are reset to scratch), in the order they were made (the engine sends them at
   once after each release as a plan of their own, Scheduler.flush);
2. chunks: prompt positions [start, end) to prefill per job; `pages` holds each such slot's page list after this
   plan's allocations (the device builds its page-table rows from it); a job's last chunk arms its slot;
3. table: (slot, index, page) entries new to the page tables of decoding slots;
4. rows: the decode step's makers, one per running slot (None: the row makes no frame), at batch `bucket`; empty
   when no job decodes (no step is launched).
The device reports back through StepResult (Scheduler.update): per row, the first token of the frame it made.
Pure Python: no torch, so the scheduler's tests and the engine's scripted device need no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Move:
    """A running job's row moves from src to dst (dst was freed); src is reset."""

    src: int
    dst: int


@dataclass(frozen=True)
class Reset:
    """Rows no job holds any more: every page pointed at scratch, idle."""

    slots: tuple[int, ...]


@dataclass(frozen=True)
class Chunk:
    """Prompt positions [start, end) of `job` to prefill this step; `last`: the job decodes from the next step."""

    job: object  # scheduler.Job (typed loosely: this module is imported by the scheduler)
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def last(self) -> bool:
        return self.end == self.job.prefill_end


@dataclass
class StepPlan:
    slot_ops: list[Move | Reset] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    pages: dict[int, tuple[int, ...]] = field(default_factory=dict)  # slot -> its pages, for the chunks' slots
    table: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, index, page) of decoding slots
    rows: list = field(default_factory=list)  # per running slot: the Job whose frame the step makes, or None
    bucket: int = 0  # the decode step's batch bucket (0: no step)

    @property
    def tokens(self) -> int:
        """Prompt positions prefilled by this plan."""
        return sum(c.tokens for c in self.chunks)

    @property
    def decodes(self) -> bool:
        return bool(self.rows)


@dataclass(frozen=True)
class StepResult:
    """A decode step read back: per row the job that made its frame at launch (None: no frame) and that frame's
    first token (the slow token: end of speech is read from it)."""

    makers: list
    token0: list[int]
