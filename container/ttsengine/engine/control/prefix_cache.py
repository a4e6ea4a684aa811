"""KV pages of prompt prefixes shared between requests (a stored voice's system turn). Pure Python: no torch, so
the scheduler can ask it how many pages it may count as free.

A prompt's prefix (everything before the request's own text: the references' transcripts and codes) is the same
for every request with the same voice. The first such request (a miss) prefills it as usual; once its KV is
written, the cache takes a reference on the prefix's WHOLE pages, and later requests (hits) start with those pages
in their page table and prefill only from the first position after them. The <= page_size - 1 prefix tokens
that do not fill a page are recomputed by each request into its own page: no page is ever written by two
streams, so there is no copy-on-write (a shared page is read-only by construction: every writer starts past it).

An entry is pinned while running jobs use it (`users`); an unpinned entry stays cached and is evicted
least-recently-used first when the page pool runs dry (page_pool.py). The scheduler counts pinned pages as
spoken for and unpinned ones as free-able, so its reservations still guarantee that a running job never runs out
of pages.

The key is a hash of the prefix's tokens (all rows of the prompt: ids and codes): a replaced voice gets a new key
by construction; `forget` drops a key at once (voice deleted or replaced) so its pages free sooner.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field


def prefix_key(prompt, prefix_len: int, page_size: int) -> tuple[str | None, int]:
    """prompt: int64 [n+1, T] (a CPU tensor or array); prefix_len: its shareable prefix's positions (below T - 1
    for a whole prompt: the last token is the decode step's input, never prefilled) -> (key of the prefix's whole
    pages, how many pages); (None, 0) when the prefix fills no page."""
    pages = min(prefix_len, prompt.shape[1]) // page_size
    if pages == 0:
        return None, 0
    head = prompt[:, : pages * page_size]
    data = head.contiguous().numpy().tobytes() if hasattr(head, "numpy") else bytes(memoryview(head.copy()))
    return hashlib.blake2b(data + str(tuple(head.shape)).encode(), digest_size=16).hexdigest(), pages


@dataclass
class Entry:
    key: str
    pages: list[int]  # KV pages holding positions [0, len(pages) * page_size) of the prefix
    users: int = 0  # running jobs that read these pages


@dataclass
class PrefixCache:
    entries: OrderedDict[str, Entry] = field(default_factory=OrderedDict)  # least recently used first
    hits: int = 0
    misses: int = 0
    tokens_saved: int = 0  # prompt positions hits did not prefill
    evictions: int = 0
    # page counts kept as the entries change (the scheduler reads pinned every step; /metrics reads both from
    # HTTP threads, where iterating `entries` beside the engine thread's changes could fail)
    cached_pages: int = 0  # pages the cache holds, pinned or not
    pinned_pages: int = 0  # pages running jobs read: not free-able

    def lookup(self, key: str | None) -> Entry | None:
        entry = self.entries.get(key) if key is not None else None
        return entry if entry is not None and entry.key == key else None

    def pin(self, entry: Entry, page_size: int) -> None:
        """A job admitted with this prefix (a hit) reads its pages until unpin."""
        if entry.users == 0:
            self.pinned_pages += len(entry.pages)
        entry.users += 1
        self.entries.move_to_end(entry.key)
        self.hits += 1
        self.tokens_saved += len(entry.pages) * page_size

    def insert(self, key: str, pages: list[int]) -> Entry:
        """The pages of a prefix just prefilled by a job (a miss), pinned by that job."""
        entry = Entry(key, list(pages), users=1)
        self.entries[key] = entry
        self.cached_pages += len(entry.pages)
        self.pinned_pages += len(entry.pages)
        return entry

    def unpin(self, entry: Entry) -> None:
        """A job that read `entry` finished: the entry stays cached, evictable once nobody reads it."""
        entry.users -= 1
        if entry.users == 0:
            self.pinned_pages -= len(entry.pages)

    def evict(self) -> list[int]:
        """The least recently used unpinned entry's pages (dropped from the cache); [] when every entry is pinned."""
        for key, entry in self.entries.items():
            if entry.users == 0:
                del self.entries[key]
                self.evictions += 1
                self.cached_pages -= len(entry.pages)
                return entry.pages
        return []

    def forget(self, key: str) -> list[int]:
        """Drops `key` (its voice was deleted or replaced) -> pages to free now. A pinned entry cannot be
        found any more and goes to the front of the LRU order: it is the first evicted once its users left."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return []
        if entry.users == 0:
            self.cached_pages -= len(entry.pages)
            return entry.pages
        entry.key = f"forgotten:{key}:{id(entry)}"
        self.entries[entry.key] = entry
        self.entries.move_to_end(entry.key, last=False)
        return []
