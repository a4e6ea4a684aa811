"""The KV pages on the host side: which pages each slot holds, how many holders each page has, which are free.

A page is held by the slots whose page table lists it and by the prefix cache (prefix_cache.py) when it holds a
cached prefix; it is free when nobody holds it. A slot's list is in position order: page i holds positions
[i * page_size, (i + 1) * page_size). Page 0 is the scratch page and is never handed out. Pure Python, so the
batched engine's scripted test runner keeps the real accounting.
"""

from __future__ import annotations

from .prefix_cache import PrefixCache


class PagePool:
    def __init__(self, num_pages: int, max_slots: int, page_size: int, cache: PrefixCache | None = None):
        self.page_size = page_size
        self.cache = cache  # evicted from when the free list runs dry
        self.refs = [0] * num_pages
        self.free = list(range(num_pages - 1, 0, -1))  # popped from the end: low pages first
        self.slot_pages: list[list[int]] = [[] for _ in range(max_slots)]

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
