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
# the weight files a model directory may hold (families/s1.py MODEL_FILES and CODEC_FILES: a test keeps them equal),
# named here so that weight_files() needs neither torch nor a family
MODEL_FILES = ("model.pth", "model.safetensors")
CODEC_FILES = ("codec.pth", "codec.safetensors")


def weight_files(model_dir: Path, cache_dir: Path | None) -> list[Path]:
    """The files a load of model_dir will read, found without torch (for a read started before torch is imported):
    the model's weights, and the newest converted codec under cache_dir (codec_cache.py: weights/codec-*.pt; its
    key needs torch's version, so the newest stands for it) or else the codec's own file. Missing ones are left
    out: the load reports them in its words."""
    found = [next((p for p in (model_dir / n for n in MODEL_FILES) if p.is_file()), None)]
    cached = sorted(Path(cache_dir, "weights").glob("codec-*.pt"), key=mtime) if cache_dir is not None else []
    found.append(cached[-1] if cached else next((p for p in (model_dir / n for n in CODEC_FILES) if p.is_file()),
                                                None))
    return [p for p in found if p is not None]


def mtime(p: Path) -> float:
    """p's modification time, 0 when it is gone (a file removed while a directory is listed)."""
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


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
