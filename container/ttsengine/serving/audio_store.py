"""Finished audio files kept for a while behind download links (Kokoro-FastAPI's `return_download_link`).

A file is written as `<id>.<ext>.part` while its audio is made and renamed to `<id>.<ext>` when complete, so a
link never serves half a file. Ids are 128 random bits: the link itself is the credential, like a presigned URL.

The store keeps an index in memory (name -> size, time finished): a lookup is a dict read, never a directory
scan, and a name that is not ours is refused before anything touches the disk. The directory is read once, at
start (files of an earlier run are indexed, its `.part` leftovers deleted). Kept files are bounded three ways:
each for `ttl` seconds, all together to `max_bytes` and to `max_files` (the oldest go first). Bytes of files
still being written count too: a file reserves its bytes as it grows, and one that would push the total past
`max_bytes` when no finished file is left to give way stops being kept (its link then says why). Files are
private to the server's user (0600 in a 0700 directory).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
NAME = re.compile(r"^[0-9a-f]{32}\.(mp3|opus|aac|flac|wav|pcm)$")
WAV_HEADER = 44  # audio/encode.py's wav_header: RIFF size at byte 4, data size at byte 40
FORGOTTEN = 4096  # names whose file was dropped, remembered so their link can say why


class AudioStore:
    def __init__(self, root: Path | None, ttl: float, max_bytes: int, max_files: int = 10_000,
                 clock: Callable[[], float] = time.time):
        """root None or unusable: a private temporary directory (links still work, until the process ends)."""
        self.ttl, self.max_bytes, self.max_files, self._clock = ttl, max_bytes, max_files, clock
        self.root = _usable(root) or Path(tempfile.mkdtemp(prefix="tts-downloads-"))
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name -> (size, finished at); oldest first
        self._writing: dict[str, int] = {}  # name -> bytes reserved so far
        self._bytes = 0  # kept and reserved together
        self._dropped: OrderedDict[str, str] = OrderedDict()  # name -> why it is not kept
        self._index_existing()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_files > 0

    def start(self, fmt: str) -> PendingFile | None:
        """A new file of format `fmt`, named now (the link can go out with the response's headers); None when no
        file can be kept (every slot is taken by files still being written)."""
        name = f"{secrets.token_hex(16)}.{fmt}"
        with self._lock:
            doomed = self._expired() + self._make_room(files=1)
            ok = len(self._kept) + len(self._writing) < self.max_files
            if ok:
                self._writing[name] = 0
        _remove_all(self.root, doomed)
        return PendingFile(self, name) if ok else None

    def path(self, name: str) -> Path | None:
        """The finished file of that name, or None (never made, expired, still being written, or evicted). No disk
        access: the index answers."""
        if not NAME.fullmatch(name):
            return None
        with self._lock:
            entry = self._kept.get(name)
        if entry is None or self._clock() - entry[1] > self.ttl:
            return None  # an expired file is deleted by the next write's sweep
        return self.root / name

    def why_missing(self, name: str) -> str | None:
        """Why a link names no file when the store dropped it (over the size bound, ...); None otherwise."""
        with self._lock:
            return self._dropped.get(name)

    def forget(self, name: str) -> None:
        """The file of `name` is gone from the disk (deleted behind the store's back): drop it from the index."""
        with self._lock:
            entry = self._kept.pop(name, None)
            if entry is not None:
                self._bytes -= entry[0]

    def count(self) -> tuple[int, int]:
        """(files, bytes) kept or being written."""
        with self._lock:
            return len(self._kept) + len(self._writing), self._bytes

    def sweep(self) -> None:
        """Deletes expired files and, while over a bound, the oldest."""
        with self._lock:
            doomed = self._expired() + self._make_room()
        _remove_all(self.root, doomed)

    # ---- writers (PendingFile) ------------------------------------------------------------------------------
    def _reserve(self, name: str, size: int) -> bool:
        """Counts `size` more bytes of a file being written; False (and nothing counted) when they do not fit
        even after the oldest finished files have gone."""
        with self._lock:
            if name not in self._writing or self._writing[name] + size > self.max_bytes:
                return False  # alone over the bound: drop it at once, costing the kept files nothing
            doomed = self._make_room(size=size)
            ok = self._bytes + size <= self.max_bytes
            if ok:
                self._writing[name] += size
                self._bytes += size
        _remove_all(self.root, doomed)
        return ok

    def _finished(self, name: str) -> None:
        with self._lock:
            size = self._writing.pop(name, None)
            if size is not None:
                self._kept[name] = (size, self._clock())

    def _abandon(self, name: str, why: str | None) -> None:
        with self._lock:
            self._bytes -= self._writing.pop(name, 0)
            if why:
                self._dropped[name] = why
                while len(self._dropped) > FORGOTTEN:
                    self._dropped.popitem(last=False)

    # ---- under the lock -------------------------------------------------------------------------------------
    def _expired(self) -> list[str]:
        now, doomed = self._clock(), []
        while self._kept:
            name, (size, at) = next(iter(self._kept.items()))
            if now - at <= self.ttl:
                break
            del self._kept[name]
            self._bytes -= size
            doomed.append(name)
        return doomed

    def _make_room(self, size: int = 0, files: int = 0) -> list[str]:
        """Evicts the oldest finished files until `size` more bytes and `files` more files fit (or none is left)."""
        doomed = []
        while self._kept and (self._bytes + size > self.max_bytes
                              or len(self._kept) + len(self._writing) + files > self.max_files):
            name, (old, _) = self._kept.popitem(last=False)
            self._bytes -= old
            doomed.append(name)
        return doomed

    def _index_existing(self) -> None:
        """Once, at start: an earlier run's finished files are indexed (oldest first), its .part files deleted."""
        found = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.endswith(".part") and NAME.fullmatch(entry.name[:-5]):
                    _remove(Path(entry.path))
                elif NAME.fullmatch(entry.name):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    found.append((st.st_mtime, entry.name, st.st_size))
        for mtime, name, size in sorted(found):
            self._kept[name] = (size, mtime)
            self._bytes += size
        self.sweep()


class PendingFile:
    """One file being written: write() as the audio comes, then finish() (or discard() if it fails). A write that
    would take the store past its byte bound drops the file: later writes do nothing and finish() keeps nothing."""

    def __init__(self, store: AudioStore, name: str):
        self.store, self.name = store, name
        self.kept = True
        self._part = store.root / f"{name}.part"
        fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        if not self.kept:
            return
        if not self.store._reserve(self.name, len(data)):
            self._drop(f"not kept: it grew past TTS_DOWNLOAD_MAX_BYTES ({self.store.max_bytes} bytes, shared by "
                       "every kept file and every one being written)")
            return
        self._file.write(data)

    def finish(self) -> None:
        if not self.kept:
            return
        self._file.close()
        if self.name.endswith(".wav"):
            _exact_wav_sizes(self._part)
        self._part.rename(self.store.root / self.name)
        self.store._finished(self.name)

    def discard(self) -> None:
        if self.kept:
            self._drop(None)

    def _drop(self, why: str | None) -> None:
        self.kept = False
        self._file.close()
        _remove(self._part)
        self.store._abandon(self.name, why)
        if why:
            log.warning("download file %s %s", self.name, why)


def _exact_wav_sizes(path: Path) -> None:
    """A streamed WAV's header says "to the end of the stream" (0xFFFFFFFF); the kept file knows its length,
    so it gets the real RIFF and data sizes (soxi, browsers and editors then show the true duration)."""
    size = path.stat().st_size
    if size < WAV_HEADER:
        return
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", size - 8))
        f.seek(40)
        f.write(struct.pack("<I", size - WAV_HEADER))


def _usable(root: Path | None) -> Path | None:
    if root is None:
        return None
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)  # made by an earlier version with the umask's 0755: the names are the credentials
        tempfile.TemporaryFile(dir=root).close()
        return root
    except OSError as e:
        log.warning("download links: %s is not usable (%s); keeping the files in a temporary directory",
                    root, e.strerror or e)
        return None


def _remove_all(root: Path, names: list[str]) -> None:
    for name in names:
        _remove(root / name)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
