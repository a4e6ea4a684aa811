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
# the codec cache's layout (codec_cache.py): its folder under the kernel-cache directory, an entry's name by its key
CODEC_CACHE_DIR = "weights"
CODEC_ENTRY = "codec-{key}.pt"


def first_file(model_dir: Path, names: tuple[str, ...]) -> Path | None:
    """The first of `names` that is a file in model_dir (checkpoint.py find_weights_file says when none is)."""
    return next((model_dir / n for n in names if (model_dir / n).is_file()), None)


def weight_files(model_dir: Path, cache_dir: Path | None) -> list[Path]:
    """The files a load of model_dir will read, found without torch (for a read started before torch is imported):
    the model's weights, and the newest converted codec under cache_dir (an entry's key needs torch's version, so
    the newest stands for it) or else the codec's own file. Missing ones are left out: the load reports them in its
    words."""
    entries = Path(cache_dir, CODEC_CACHE_DIR).glob(CODEC_ENTRY.format(key="*")) if cache_dir is not None else ()
    cached = max(entries, key=mtime, default=None)
    found = [first_file(model_dir, MODEL_FILES), cached or first_file(model_dir, CODEC_FILES)]
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
