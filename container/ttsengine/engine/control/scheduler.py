"""Which sequences run in the next step. Pure Python: no torch, no device, easy to test.

A `Job` is one generation (one text chunk of a request). Running jobs occupy slots 0..B-1 with no
holes: when a job leaves, the job in the last slot moves into its place (the runner copies that
row's device state), so the batch bucket is always the smallest that covers B.

Each step's work leaves as one StepPlan (step_plan.py: slot moves and resets, prefill chunks with their pages,
page-table entries, the decode rows and bucket) and comes back as a StepResult (update: frames recorded, finished
jobs released). The scheduler owns the page pool (page_pool.py), the one owner of the KV pages.

Admission is FIFO, bounded by free slots and free KV pages: each job reserves the pages its longest
possible sequence needs, so a running job never runs out. A prompt prefix cached for earlier requests
(prefix_cache.py) is not reserved again: its pages are counted once, as pinned, while jobs read them; cached
pages nobody reads count as free (the page pool evicts them when it needs the room). A request whose prefix a
running request is still writing as a miss waits (FIFO) until those pages are cached, then starts from them: a
burst on a new voice computes its prefix once.

Prefill is chunked: each step prefills at most a token budget of prompt positions, so the decode steps of
running streams keep their pace while a long prompt goes in over several steps. New jobs' first chunks go
first (a short request is not stuck behind a long one), then the continuations of earlier long prompts, fewest
positions left first; the oldest continuation always gets at least `min_chunk` positions, so neither new
arrivals nor shorter continuations can starve it.
A job decodes (takes part in the frames a step reads back) once its last chunk ran.

The waiting queue is bounded: a full engine refuses new work at once (BusyError), it never queues
without limit. Continuations of a long text go to the front: they already hold a client.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import BusyError
from .page_pool import PagePool
from .prefix_cache import Entry, PrefixCache
from .step_plan import Chunk, Move, Reset, StepPlan, StepResult

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
    prefix_key: str | None = None  # the prompt's shareable prefix (prefix_cache.prefix_key); None: not shared
    prefix_pages: int = 0  # that prefix's whole pages
    prefix: Entry | None = None  # the cached prefix this job reads (a hit's, or its own once cached)
    prefilled: int = 0  # prompt positions whose KV is written or planned (a hit's cached prefix included)
    in_flight: int = 0  # decode steps planned for this job whose frames were not read yet (each writes a position)
    # what the device plane prefills (opaque here: the control plane never looks inside)
    prompt: object = None  # int64 [n+1, T] CPU tensor
    sampling: tuple = ()  # (temperature, top_p, repetition_penalty, seed)
    frame_offset: int = 0  # frames the request generated before this job (the sampler's RNG counter start)
    deadline: float = 0.0  # the queue is kept in this order (ties: arrival): queued-at + slack (segment_slack)

    @property
    def max_len(self) -> int:
        """Positions this job may write into the KV cache."""
        return self.prompt_len + self.max_frames

    @property
    def prefill_end(self) -> int:
        """Prompt positions prefill writes: all but the last, which is the first decode step's input."""
        return max(self.prompt_len - 1, 0)

    @property
    def decoding(self) -> bool:
        """Its prompt is in: the decode steps make its frames (the first one the step after its last chunk)."""
        return self.prefilled >= self.prefill_end

    @property
    def shared_pages(self) -> int:
        """Of the pages this job reads, those the prefix cache holds (not in the job's own reservation)."""
        return len(self.prefix.pages) if self.prefix is not None else 0


class Scheduler:
    def __init__(self, max_slots: int, max_queue: int, total_pages: int, page_size: int,
                 prefill_tokens: int, cache: PrefixCache | None = None, min_chunk: int | None = None,
                 bucket: Callable[[int], int] | None = None):
        """total_pages: KV pages that can be handed out (the scratch page excluded); prefill_tokens: the largest
        prefill budget per step (schedule() may be given a smaller one); cache: the prefix cache (None: off);
        min_chunk: positions the oldest continuation gets per step at least (default one page); bucket: the decode
        step's batch for a number of rows (default: the rows)."""
        self.max_slots, self.max_queue = max_slots, max_queue
        self.page_size = page_size
        self.prefill_tokens = prefill_tokens
        self.cache = cache
        self.pool = PagePool(total_pages + 1, max_slots, page_size, cache)
        self.min_chunk = page_size if min_chunk is None else min_chunk
        self.bucket = bucket if bucket is not None else (lambda rows: rows)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # index = slot
        self._slot_ops: list[Move | Reset] = []  # made by releases, carried out by flush() or the next plan

    # ---- queue --------------------------------------------------------------------------------
    def pages_for(self, job: Job) -> int:
        return self.pool.pages_for(job.max_len)

    def submit(self, job: Job, front: bool = False) -> None:
        if self.pages_for(job) > self.pool.total:  # the planner's capacity guard lets no such request in
            raise ValueError(f"a job of {job.max_len} KV positions can never be admitted: the cache holds "
                             f"{self.pool.total * self.page_size}")
        if front:
            self.waiting.appendleft(job)
            return
        if len(self.waiting) >= self.max_queue + self.free_slots:  # a burst waits here for the free slots too
            raise BusyError(f"the engine is busy ({len(self.running)} streams running, {len(self.waiting)} "
                            "waiting); retry shortly")
        # earliest deadline first, arrival order among equals: without slack every deadline is its arrival (or 0),
        # so this is an append; a job with slack goes behind those due before it (scanned from the back)
        i = len(self.waiting)
        while i and self.waiting[i - 1].deadline > job.deadline:
            i -= 1
        self.waiting.insert(i, job)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_slots - len(self.running))

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- per step -----------------------------------------------------------------------------
    def schedule(self, budget: int | Callable[[int], int] | None = None) -> StepPlan:
        """This step's plan (step_plan.py): the slot operations releases left, the prefill chunks (chunks()) with
        their slots' pages, the prefixes they complete cached, and a decode step over the running jobs if any
        decodes, with the pages its writes need."""
        chunks = self.chunks(budget)
        plan = StepPlan(chunks=chunks)
        pool = self.pool
        for c in chunks:  # an armed slot also holds the page of its first decode position (the prompt's last)
            if c.last or c.end > c.start:
                pool.grow(c.job.slot, c.end if c.last else c.end - 1)
        plan.pages = {c.job.slot: tuple(pool.slot_pages[c.job.slot]) for c in chunks}
        for c in chunks:  # a miss that wrote its prefix's pages offers them to later requests
            if self.can_cache(c.job):
                self.cache_prefix(c.job, pool.keep(c.job.slot, c.job.prefix_pages))
        if any(j.decoding for j in self.running):
            # a job whose prompt is still going in keeps an idle row (no frame, a scratch table row); a job the step
            # in flight makes a frame for writes one position further than its count says
            for j in self.running:
                if j.decoding:
                    plan.table += pool.grow(j.slot, j.prompt_len + j.generated - 1 + j.in_flight)
            plan.rows = [j if j.decoding else None for j in self.running]
            plan.bucket = self.bucket(len(self.running))
            for j in plan.rows:
                if j is not None:
                    j.in_flight += 1
        plan.slot_ops = self._take_slot_ops()  # last: growing pages may raise, and the ops would then be lost
        return plan

    def flush(self) -> StepPlan:
        """A plan of the slot operations alone: the engine sends one right after each release, so a row is reset
        before its stream hears of its end."""
        return StepPlan(slot_ops=self._take_slot_ops())

    def update(self, result: StepResult, eos_id: int) -> list[Job]:
        """A decode step read back: records each maker's frame, releases the jobs that finished -> those jobs."""
        for job in result.makers:
            if job is not None:
                job.in_flight -= 1
        finished = self.record_frames(result.token0, eos_id, result.makers)
        if finished:
            self.release(finished)
        return finished

    def _take_slot_ops(self) -> list[Move | Reset]:
        ops, self._slot_ops = self._slot_ops, []
        return ops

    def chunks(self, budget: int | Callable[[int], int] | None = None) -> list[Chunk]:
        """This step's prefill work, at most `budget` prompt positions (default and ceiling: prefill_tokens; the
        oldest continuation's min_chunk may go past a smaller budget):
        first the first chunks of waiting jobs moved into free slots (FIFO, stopping at the first that does not
        fit: no overtaking, so a large request cannot starve), then the next chunks of earlier long prompts, fewest
        positions left first, the oldest with at least min_chunk. A chunk may be empty (a one-token prompt): it
        only arms the job. `budget` may be a function of the rows the step will run (running jobs, admitted ones
        included): each admission is checked against the budget at the rows it brings the step to, so a burst of
        arrivals goes in as fast as the step at each size leaves room, not at the pace of the full batch."""
        at = (lambda rows: self.prefill_tokens) if budget is None else \
            budget if callable(budget) else (lambda rows, n=int(budget): n)
        clamp = lambda rows: max(1, min(at(rows), self.prefill_tokens))  # noqa: E731
        continuing = [j for j in self.running if not j.decoding]
        chunks = [Chunk(job, job.prefilled, job.prefilled + min(job.prefill_end - job.prefilled, room))
                  for job, room in self._admit(clamp)]
        budget = clamp(len(self.running))
        room = budget - sum(c.tokens for c in chunks)
        take: dict[int, int] = {}
        if continuing:  # progress: the oldest gets min_chunk even when new first chunks took the budget
            # by admission (job ids grow), not slot: a finished job's slot takes the last one's, so slots reorder
            oldest = min(continuing, key=lambda j: j.id)
            take[oldest.id] = min(oldest.prefill_end - oldest.prefilled, self.min_chunk, budget)
            room -= take[oldest.id]
        # then the fewest positions left first: the stream closest to its first frame gets there soonest
        for job in sorted(continuing, key=lambda j: j.prefill_end - j.prefilled):
            extra = max(0, min(job.prefill_end - job.prefilled - take.get(job.id, 0), room))
            take[job.id] = take.get(job.id, 0) + extra
            room -= extra
            if take[job.id] > 0:
                chunks.append(Chunk(job, job.prefilled, job.prefilled + take[job.id]))
        for c in chunks:
            c.job.prefilled = c.end
        return chunks

    def _admit(self, budget_at: Callable[[int], int]) -> list[tuple[Job, int]]:
        """Waiting jobs moved into free slots while the budget at the rows each brings leaves room -> (job, prefill
        positions its first chunk may take)."""
        admitted: list[tuple[Job, int]] = []
        used = 0
        writing = self._prefixes_being_written()
        while self.waiting and len(self.running) < self.max_slots and used < budget_at(len(self.running) + 1):
            job = self.waiting[0]
            if job.cancelled:
                self.waiting.popleft()
                job.finish_reason = "cancelled"
                continue
            entry = self.cache.lookup(job.prefix_key) if self.cache is not None else None
            if entry is None and job.prefix_key in writing:
                # a running job is writing this prefix's pages (a burst on a voice not cached yet): wait until they
                # are cached, a step or two, and start from them, rather than compute the same prefix again.
                # Those behind it wait too (FIFO); the wait ends when that job caches them or leaves.
                break
            shared = len(entry.pages) if entry is not None else 0
            newly_pinned = shared if entry is not None and entry.users == 0 else 0
            own = self.pages_for(job) - shared
            if not self.pool.fits(own, newly_pinned):
                break
            self.waiting.popleft()
            self.pool.reserved += own
            job.slot = len(self.running)
            self.running.append(job)
            if entry is not None:  # a hit: the slot starts with the cached pages, prefill starts past them
                self.cache.pin(entry, self.page_size)
                self.pool.share(job.slot, entry.pages)
                job.prefix, job.prefilled = entry, shared * self.page_size
            elif job.prefix_key is not None and self.cache is not None:
                self.cache.misses += 1
                writing.add(job.prefix_key)
            room = budget_at(len(self.running)) - used
            admitted.append((job, room))
            used += min(job.prefill_end - job.prefilled, room)
        return admitted

    def _prefixes_being_written(self) -> set[str]:
        """Prefix keys that running jobs are prefilling as misses: the cache will have them once those jobs pass
        their prefix pages (can_cache / cache_prefix)."""
        if self.cache is None:
            return set()
        return {j.prefix_key for j in self.running if j.prefix_key is not None and j.prefix is None
                and j.prefilled < j.prefix_pages * self.page_size}

    def can_cache(self, job: Job) -> bool:
        """The job prefilled its shareable prefix's pages and nobody cached that prefix yet: it may offer them."""
        return (self.cache is not None and job.prefix_key is not None and job.prefix is None
                and job.prefilled >= job.prefix_pages * self.page_size
                and self.cache.lookup(job.prefix_key) is None)

    def cache_prefix(self, job: Job, pages: list[int]) -> None:
        """The job's first pages become the cached prefix (the pool gave the cache its reference): they move
        from the job's own reservation to the pinned pages, so the count stays the same."""
        job.prefix = self.cache.insert(job.prefix_key, pages)
        self.pool.reserved -= len(pages)

    def record_frames(self, token0: list[int], eos_id: int, makers: list[Job | None] | None = None) -> list[Job]:
        """token0[row] of the frame each row of the last step generated -> the jobs that finished. makers[row]: the
        job that made that row's frame when the step was launched, None for a row that made none (default: the
        running jobs that are decoding now). A maker that finished since (an overlapped step ran one frame past a
        job's end) is skipped: that frame is not the job's."""
        if makers is None:
            makers = [job if job.decoding else None for job in self.running]
        done = []
        for job, tok in zip(makers, token0):
            if job is None or job.finish_reason is not None:
                continue
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
        """Frees the slots and pages of finished jobs (a cached prefix's pages stay cached); returns the (from, to)
        slot moves that keep 0..B-1 dense. The device's share, the moves and the freed rows' resets, goes out with
        flush() (the engine's, right after the release) or else the next plan."""
        for job in jobs:
            self.pool.release(job.slot)
        old = len(self.running)
        moves = []
        for job in sorted(jobs, key=lambda j: j.slot, reverse=True):
            slot, last = job.slot, len(self.running) - 1
            if slot != last:
                mover = self.running[last]
                self.running[slot] = mover
                mover.slot = slot
                self.pool.move(last, slot)
                moves.append((last, slot))
            self.running.pop()
            self.pool.reserved -= self.pages_for(job) - job.shared_pages
            if job.prefix is not None:
                self.cache.unpin(job.prefix)
                job.prefix = None
            job.slot = None
        self._slot_ops += [Move(src, dst) for src, dst in moves]
        if len(self.running) < old:
            self._slot_ops.append(Reset(tuple(range(len(self.running), old))))
        return moves
