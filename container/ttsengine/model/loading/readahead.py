"""Reading weight files into the page cache in the background, so the disk works while the start does other
things (tokenizer, building the modules, the other file) and the copies to the device find the pages there.

One thread per file reads it sequentially in large blocks (the fastest pattern for a disk or a network volume,
and it works where posix_fadvise is a no-op, e.g. FUSE); it stops at once when asked, and is a daemon: a start
never waits for it. On a file already in the page cache it costs a memory copy on an otherwise idle core.
"""

from __future__ import annotations

import threading
from pathlib import Path

BLOCK = 8 << 20


class Readahead:
    def __init__(self, paths: list[Path]):
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._read, args=(Path(p),), name=f"readahead-{Path(p).name}",
                                         daemon=True) for p in paths]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        for t in self.threads:
            t.join(timeout)

    def _read(self, path: Path) -> None:
        buf = bytearray(BLOCK)
        try:
            with open(path, "rb", buffering=0) as f:
                while not self._stop.is_set() and f.readinto(buf):
                    pass
        except OSError:
            pass  # only a hint: the load itself reports unreadable files
