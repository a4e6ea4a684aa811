"""Which sequences run in the next step. Pure Python: no torch, no device, easy to test.

A `Job` is one generation (one text chunk of a request). Running jobs occupy slots 0..B-1 with no
holes: when a job leaves, the job in the last slot moves into its place (the runner copies that
row's device state), so the batch bucket is always the smallest that covers B.

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
from .prefix_cache import Entry, PrefixCache

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


@dataclass(frozen=True)
class Chunk:
    """Prompt positions [start, end) of `job` to prefill this step; `last`: the job decodes from the next step."""

    job: Job
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def last(self) -> bool:
        return self.end == self.job.prefill_end


class Scheduler:
    def __init__(self, max_slots: int, max_queue: int, total_pages: int, page_size: int,
                 prefill_tokens: int, cache: PrefixCache | None = None, min_chunk: int | None = None):
        """prefill_tokens: the largest prefill budget per step (schedule() may be given a smaller one);
        cache: the prefix cache (None: off); min_chunk: positions the oldest continuation gets per step at least
        (default one page)."""
        self.max_slots, self.max_queue = max_slots, max_queue
        self.total_pages, self.page_size = total_pages, page_size
        self.prefill_tokens = prefill_tokens
        self.cache = cache
        self.min_chunk = page_size if min_chunk is None else min_chunk
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # index = slot
        self.reserved_pages = 0  # the running jobs' own pages (cached prefix pages excluded)

    # ---- queue --------------------------------------------------------------------------------
    def pages_for(self, job: Job) -> int:
        return -(-job.max_len // self.page_size)

    @property
    def pinned_pages(self) -> int:
        return self.cache.pinned_pages if self.cache is not None else 0

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
    def schedule(self, budget: int | Callable[[int], int] | None = None) -> list[Chunk]:
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
            if self.reserved_pages + own + self.pinned_pages + newly_pinned > self.total_pages:
                break
            self.waiting.popleft()
            self.reserved_pages += own
            if entry is not None:  # a hit: its first prefill position is the first past the cached pages
                self.cache.pin(entry, self.page_size)
                job.prefix, job.prefilled = entry, shared * self.page_size
            elif job.prefix_key is not None and self.cache is not None:
                self.cache.misses += 1
                writing.add(job.prefix_key)
            job.slot = len(self.running)
            self.running.append(job)
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
        self.reserved_pages -= len(pages)

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
            self.reserved_pages -= self.pages_for(job) - job.shared_pages
            if job.prefix is not None:
                self.cache.unpin(job.prefix)
                job.prefix = None
            job.slot = None
        return moves
