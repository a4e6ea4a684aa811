"""Finished audio files kept for a while behind download links (Kokoro-FastAPI's `return_download_link`).

A file is written as `<id>.<ext>.part` while its audio is made and renamed to `<id>.<ext>` when complete, so a
link never serves half a file. Ids are 128 random bits: the link itself is the credential, like a presigned URL.
Kept files are bounded twice: each for `ttl` seconds (by modification time, so files of an earlier run expire
too) and all together to `max_bytes` (the oldest go first). Every new file and every lookup sweeps first; no
background thread.
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
from pathlib import Path

log = logging.getLogger(__name__)
NAME = re.compile(r"^[0-9a-f]{32}\.(mp3|opus|aac|flac|wav|pcm)$")
WAV_HEADER = 44  # audio/encode.py's wav_header: RIFF size at byte 4, data size at byte 40


class AudioStore:
    def __init__(self, root: Path | None, ttl: float, max_bytes: int):
        """root None or unusable: a private temporary directory (links still work, until the process ends)."""
        self.ttl, self.max_bytes = ttl, max_bytes
        self.root = _usable(root) or Path(tempfile.mkdtemp(prefix="tts-downloads-"))
        self._lock = threading.Lock()

    def start(self, fmt: str) -> PendingFile:
        """A new file of format `fmt`, named now (the link can go out with the response's headers)."""
        self.sweep()
        return PendingFile(self, f"{secrets.token_hex(16)}.{fmt}")

    def path(self, name: str) -> Path | None:
        """The finished file of that name, or None (never made, expired, still being written, or evicted)."""
        if not NAME.fullmatch(name):
            return None
        self.sweep()
        path = self.root / name
        return path if path.is_file() else None

    def sweep(self, keep: str = "") -> None:
        """Deletes expired files (and .part files left by an earlier run), then the oldest finished files until
        the rest fit in max_bytes. `keep` (a file just finished) goes last; one alone over max_bytes goes at
        once, costing the others nothing."""
        now = time.time()
        with self._lock:
            files = []
            for entry in os.scandir(self.root):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                if now - st.st_mtime > self.ttl or (entry.name == keep and st.st_size > self.max_bytes):
                    _remove(Path(entry.path))
                elif NAME.fullmatch(entry.name):
                    files.append((entry.name == keep, st.st_mtime, st.st_size, entry.path))
            total = sum(size for _, _, size, _ in files)
            for _, _, size, path in sorted(files):  # not `keep` first, then oldest first
                if total <= self.max_bytes:
                    break
                _remove(Path(path))
                total -= size


class PendingFile:
    """One file being written: write() as the audio comes, then finish() (or discard() if it fails)."""

    def __init__(self, store: AudioStore, name: str):
        self.store, self.name = store, name
        self._part = store.root / f"{name}.part"
        self._file = open(self._part, "wb")  # noqa: SIM115 - closed by finish() or discard()

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def finish(self) -> None:
        self._file.close()
        if self.name.endswith(".wav"):
            _exact_wav_sizes(self._part)
        try:
            self._part.rename(self.store.root / self.name)
        except FileNotFoundError:  # a sweep took it: it was written for longer than the ttl
            log.warning("download file %s expired before it was finished", self.name)
            return
        self.store.sweep(keep=self.name)

    def discard(self) -> None:
        self._file.close()
        _remove(self._part)


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
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()
        return root
    except OSError as e:
        log.warning("download links: %s is not usable (%s); keeping the files in a temporary directory",
                    root, e.strerror or e)
        return None


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
