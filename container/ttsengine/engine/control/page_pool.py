"""The one owner of the KV pages: which pages each slot holds, how many holders each page has, which are free, and
how many the running jobs have reserved.

A page is held by the slots whose page table lists it and by the prefix cache (prefix_cache.py) when it holds a
cached prefix; it is free when nobody holds it. A slot's list is in position order: page i holds positions
[i * page_size, (i + 1) * page_size). Page 0 is the scratch page and is never handed out.

Reservations: admission (scheduler.py) reserves the pages of a job's longest possible sequence, so a running job
never runs out. Pages of a cached prefix are not reserved again: they count once, as pinned, while jobs read them;
cached pages nobody reads count as free (grow evicts them when it needs the room). Pure Python: the device plane
only ever sees the page lists a step plan carries (step_plan.py).
"""

from __future__ import annotations

from .prefix_cache import PrefixCache


class PagePool:
    def __init__(self, num_pages: int, max_slots: int, page_size: int, cache: PrefixCache | None = None):
        self.page_size = page_size
        self.total = num_pages - 1  # pages that can be handed out (the scratch page excluded)
        self.reserved = 0  # the running jobs' own pages, reserved at admission (cached prefix pages excluded)
        self.cache = cache  # evicted from when the free list runs dry
        self.refs = [0] * num_pages
        self.free = list(range(num_pages - 1, 0, -1))  # popped from the end: low pages first
        self.slot_pages: list[list[int]] = [[] for _ in range(max_slots)]

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    @property
    def pinned(self) -> int:
        """Pages of cached prefixes that running jobs read: not free-able."""
        return self.cache.pinned_pages if self.cache is not None else 0

    def fits(self, own: int, newly_pinned: int = 0) -> bool:
        """A job reserving `own` pages, and pinning `newly_pinned` cached ones nobody reads yet, fits beside the
        reservations and the pinned pages."""
        return self.reserved + own + self.pinned + newly_pinned <= self.total

    def grow(self, slot: int, last_pos: int) -> list[tuple[int, int, int]]:
        """Pages for positions up to last_pos -> the new (slot, index, page) entries of its page table."""
        held = self.slot_pages[slot]
        new = []
        while len(held) <= last_pos // self.page_size:
            page = self._take()
            new.append((slot, len(held), page))
            held.append(page)
        return new

    def _take(self) -> int:
        if not self.free and self.cache is not None:
            self.unref(self.cache.evict())  # an unpinned cached prefix, least recently used
        if not self.free:  # the scheduler's reservations (cached-but-unpinned pages counted free) prevent this
            raise RuntimeError("out of KV pages: the scheduler reserved too few")
        page = self.free.pop()
        self.refs[page] = 1
        return page

    def share(self, slot: int, pages: list[int]) -> None:
        """The slot starts with a cached prefix's pages (a hit); it writes only past them."""
        assert not self.slot_pages[slot], "a slot shares a prefix before it holds pages of its own"
        for p in pages:
            self.refs[p] += 1
        self.slot_pages[slot] = list(pages)

    def keep(self, slot: int, count: int) -> list[int]:
        """The prefix cache takes a reference on the slot's first `count` pages -> those pages."""
        pages = self.slot_pages[slot][:count]
        assert len(pages) == count, "a prefix is cached before its pages were written"
        for p in pages:
            self.refs[p] += 1
        return pages

    def release(self, slot: int) -> None:
        self.unref(self.slot_pages[slot])
        self.slot_pages[slot] = []

    def unref(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)

    def move(self, src: int, dst: int) -> None:
        assert not self.slot_pages[dst], "moved onto a slot whose pages were not released"
        self.slot_pages[dst], self.slot_pages[src] = self.slot_pages[src], []
