"""The codec's weights converted once to their run dtype (bf16 on CUDA) and kept in the kernel-cache directory.

The real `codec.pth` is 1.87 GB of fp32 parameters (weight norm as (g, v)) plus 0.3 GB of buffers the engine
recomputes; what the engine keeps is the folded weights in bf16, 0.78 GB. A start that finds the entry reads
that instead: less than half the bytes, and no fold or conversion on the CPU.

Key. Every start computes it, so it must be cheap, and a different source file must never hit:
sha256 of the file's size, its first and last MiB and 14 windows of 64 KiB spread evenly between
(~2 MiB read, a few ms). A torch zip checkpoint ends with the zip's central directory, which holds the CRC-32
of every record (every tensor's bytes), so the last MiB alone changes when any tensor does; the spread windows
cover files without such a directory (safetensors). No path or mtime: the same file unpacked elsewhere
(SageMaker's model.tar.gz, a baked image, a copied volume) still hits. The torch version and the dtype are part
of the key too (a newer torch may round a fold differently: the entry is remade once).

Entry. `weights/codec-KEY.pt`: a torch zip file (read with mmap and weights_only like model.pth) holding
{"format", "key", "dtype", "digest", "state_dict"}, written to a temporary file in the same directory, fsynced
and renamed into place, by a background thread so the start does not wait for the disk. Read back, it must have
the expected names, shapes and dtype and the digest of a sample of its values; anything else (garbage,
truncation, another version) logs one warning, is deleted, and the original file is read and converted again.
The two most recently used entries are kept (a rollback to the previous model still hits); older ones go.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from ...compat import load_torch_file, torch_version
from ...errors import CheckpointError
from ..state_dict import StateDict
from .readahead import CODEC_CACHE_DIR, CODEC_ENTRY, mtime

log = logging.getLogger(__name__)
FORMAT = 1  # bump when what an entry holds changes
EDGE = 1 << 20  # bytes hashed at each end of the source
WINDOW, WINDOWS = 64 << 10, 14  # and in between
KEEP = 2  # entries kept, most recently used first
_SAMPLES = 64  # values per tensor in an entry's digest
_WRITERS: list[threading.Thread] = []  # entries being written by this process


def wait_for_writers() -> None:
    """Until every entry this process started writing is on disk (`warm` reports a complete cache)."""
    while _WRITERS:
        _WRITERS.pop().join()


def source_identity(path: Path) -> str:
    """sha256 of the file's size, first and last MiB and WINDOWS windows in between (see the module doc)."""
    size = os.stat(path).st_size
    h = hashlib.sha256(f"size {size}".encode())
    spans = [(0, EDGE), (max(0, size - EDGE), EDGE)]
    spans += [((i + 1) * size // (WINDOWS + 1), WINDOW) for i in range(WINDOWS)]
    with open(path, "rb") as f:
        for offset, length in spans:
            f.seek(offset)
            h.update(f.read(length))
    return h.hexdigest()


def digest(sd: StateDict) -> str:
    """Names, shapes, dtypes and _SAMPLES evenly spread values of every tensor: reads ~one page per value from an
    mmap'd file, so checking it costs milliseconds, yet it catches zeroed or garbled regions and wrong tensors."""
    h = hashlib.sha256()
    for name, t in sd.items():
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        flat = t.detach().reshape(-1)
        if flat.numel():
            sample = flat[:: max(1, flat.numel() // _SAMPLES)][:_SAMPLES].contiguous()
            h.update(sample.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class CodecCache:
    """One directory of converted codecs; `status` says what the last load did: off | hit | miss | damaged."""

    def __init__(self, directory: Path, keep: int = KEEP):
        self.directory = Path(directory)
        self.keep = keep
        self.status = "off"
        self._writer: threading.Thread | None = None
        self._keys: dict[tuple, str] = {}

    def entry(self, source: Path, dtype: torch.dtype) -> tuple[Path, str]:
        """-> (the entry's path, its key) for `source` converted to `dtype`."""
        st = os.stat(source)
        memo = (str(source), str(dtype), st.st_size, st.st_mtime_ns)  # one load asks up to three times
        if memo not in self._keys:
            text = json.dumps({"format": FORMAT, "source": source_identity(source), "dtype": str(dtype),
                               "torch": ".".join(map(str, torch_version()))}, sort_keys=True)
            self._keys[memo] = hashlib.sha256(text.encode()).hexdigest()[:20]
        key = self._keys[memo]
        return self.directory / CODEC_ENTRY.format(key=key), key

    def read(self, source: Path, dtype: torch.dtype, expected: dict[str, Tensor]) -> StateDict | None:
        """The converted state dict of `source` if a sound entry exists (mmap'd: read as it is used), else None.
        expected: the module's state dict (meta tensors do): the names and shapes an entry must have."""
        path, key = self.entry(source, dtype)
        if not path.is_file():
            self.status = "miss"
            return None
        try:
            sd = self._check(load_torch_file(path), key, dtype, expected)
        except (CheckpointError, ValueError, TypeError, KeyError) as e:
            log.warning("codec cache entry %s is damaged (%s): reading %s instead", path, e, source)
            with contextlib.suppress(OSError):  # a read-only cache (SageMaker's /opt/ml/model) keeps it
                path.unlink(missing_ok=True)
            self.status = "damaged"
            return None
        with contextlib.suppress(OSError):  # a read-only cache (baked into an image) still serves
            os.utime(path)  # most recently used: kept by the pruning
        self.status = "hit"
        return sd

    def convert(self, sd: StateDict, source: Path, dtype: torch.dtype, expected: dict[str, Tensor]) -> StateDict:
        """The source's state dict (names as the module's) -> the module's entries, floating ones in `dtype`
        (on the CPU: bit-equal to converting on the GPU, both round to nearest even), and starts writing them as
        the entry. Entries the module does not hold (the file's buffers) are left out. A source already in
        `dtype`, or not matching the module (the load reports that), is returned as it is and not cached."""
        floats = [t for k, t in sd.items() if k in expected and t.is_floating_point()]
        if set(expected) - set(sd) or all(t.dtype == dtype for t in floats):
            self.status = "off"
            return sd
        out = {k: (t.to(dtype) if t.is_floating_point() else t).contiguous() for k, t in sd.items() if k in expected}
        path, key = self.entry(source, dtype)
        if self.status != "damaged":
            self.status = "miss"
        self._writer = threading.Thread(target=self._write, args=(path, key, dtype, out), name="codec-cache-writer")
        self._writer.start()  # not a daemon: the interpreter waits for it at exit, so a short run still completes it
        _WRITERS.append(self._writer)
        return out

    def wait(self) -> None:
        """Until the entry being written (if any) is on disk."""
        if self._writer is not None:
            self._writer.join()

    def _check(self, obj: object, key: str, dtype: torch.dtype, expected: dict[str, Tensor]) -> StateDict:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("key") != key:
            raise ValueError("not an entry of this format and key")
        sd = obj["state_dict"]
        if not isinstance(sd, dict) or set(sd) != set(expected):
            raise ValueError("its names are not the codec's")
        for k, t in sd.items():
            if not isinstance(t, Tensor) or t.shape != expected[k].shape:
                raise ValueError(f"{k}: wrong shape")
            if t.is_floating_point() and t.dtype != dtype:
                raise ValueError(f"{k}: {t.dtype}, not {dtype}")
        if obj.get("digest") != digest(sd):
            raise ValueError("its values do not match its digest")
        return sd

    def _write(self, path: Path, key: str, dtype: torch.dtype, sd: StateDict) -> None:
        start = time.perf_counter()
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                torch.save({"format": FORMAT, "key": key, "dtype": str(dtype), "digest": digest(sd),
                            "state_dict": sd}, f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of a shared cache volume
            os.replace(tmp, path)
            tmp = None
            self.prune()
            log.info("codec cache: wrote %s (%.2f GB) in %.1f s", path, path.stat().st_size / 1e9,
                     time.perf_counter() - start)
        except OSError as e:  # a full or read-only volume costs the next start a conversion, nothing more
            log.warning("codec cache: could not write %s (%s)", path, e.strerror or e)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def prune(self) -> None:
        """Keeps the `keep` most recently used entries; removes older ones and temporary files of dead writers."""
        entries = sorted(self.directory.glob(CODEC_ENTRY.format(key="*")), key=mtime, reverse=True)
        stale = [p for p in self.directory.glob("codec-*.tmp") if time.time() - mtime(p) > 3600]
        for p in entries[self.keep:] + stale:
            p.unlink(missing_ok=True)


def make(directory: Path | None, switch: str) -> CodecCache | None:
    """The cache under `directory` (the kernel-cache dir) unless there is none or `switch` is off."""
    if directory is None or switch == "off":
        return None
    return CodecCache(Path(directory) / CODEC_CACHE_DIR)
