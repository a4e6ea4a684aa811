"""The torch.compile kernel cache: where it lives, whether it fits this machine, and its portable blob.

TTS_CACHE_DIR holds Inductor's and Triton's caches (a named volume in docker compose, the network
volume on RunPod), so a restart does not recompile. `python -m ttsengine warm` also writes a blob
that can be shipped into an empty directory (model.tar.gz on SageMaker, a baked image): a zip of
torch's portable artifacts (torch >= 2.7: `torch.compiler.save_cache_artifacts`), the Triton
cache directory, which holds the kernels torch's artifacts leave out (ours: paged attention, Snake,
int8; without them a blob start compiled them again: docs/performance.md, "Start time and kernel cache"), and the
decode step's
precompiled units (torch >= 2.10, engine/device/compile/precompiled.py); on older torch the Inductor directory too.
A cache made for another GPU, torch, Triton or model is detected from its metadata:
one log line, then a recompile, never a crash.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .... import compat
from .early_kernels import BLOB, GROUP_FILES, TRITON_DIR

log = logging.getLogger(__name__)
FORMAT = 2  # bump when what the engine compiles changes shape, or the blob's layout
ARTIFACTS = "torch-artifacts.bin"  # torch's portable artifacts inside the blob


def environment() -> dict[str, str]:
    """What compiled kernels depend on, besides the model and engine settings."""
    env = {"torch": torch.__version__, "cache_format": str(FORMAT)}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "none"
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["cuda"] = str(torch.version.cuda)
    else:
        env["gpu"] = "cpu"
    return env


@dataclass
class KernelCache:
    directory: Path | None
    describe: dict = field(default_factory=dict)  # model + settings that shape the compiled graphs
    status: str = "off"  # off | miss | dir | blob | mismatch

    @property
    def key(self) -> str:
        text = json.dumps({**environment(), **self.describe}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def precompiled_dir(self) -> Path | None:
        """Where the decode step's precompiled units live (engine/device/compile/precompiled.py); per key, so a cache
        made elsewhere is never loaded."""
        return None if self.directory is None else self.directory / f"precompiled-{self.key}"

    @property
    def blob_path(self) -> Path:
        return self.directory / BLOB.format(key=self.key)

    def setup(self) -> str:
        """Points the caches at the directory and loads what fits; -> status. Call before compiling. Inductor's
        options and torch's artifacts from the blob are set and loaded at the first compile (compat.compiler):
        importing Inductor imports torch._dynamo, ~1 s that a start's first audio need not wait for (our Triton
        kernels' cache is files, written here)."""
        compat.before_first_compile(lambda: compat.set_inductor_options(fx_graph_cache=True, autotune_local_cache=True))
        if self.directory is None:
            self.status = "off"
            return self.status
        self.directory.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.directory / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(self.directory / TRITON_DIR)
        os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"  # off by default before torch 2.5
        meta_path = self.directory / "cache-meta.json"
        meta = _read_json(meta_path)
        if meta and meta.get("key") != self.key:
            log.warning("kernel cache in %s was built for %s: recompiling", self.directory,
                        _difference(meta, environment(), self.describe))
            self.status = "mismatch"
        elif self.blob_path.is_file():
            try:
                loaded = self._unpack(self.blob_path.read_bytes())
                self.status = "blob" if loaded else ("dir" if meta else "miss")
            except Exception as e:  # noqa: BLE001 - a bad blob only costs a recompile
                log.warning("kernel cache blob %s could not be loaded (%s): recompiling", self.blob_path, e)
                self.status = "miss"
        else:
            self.status = "dir" if meta else "miss"
        relinked = relink_triton_groups(self.directory / TRITON_DIR)
        log.info("kernel cache %s: %s (key %s)%s", self.directory, self.status, self.key,
                 f"; {relinked} Triton kernel(s) made elsewhere relinked here" if relinked else "")
        return self.status

    def save_metadata(self) -> None:
        """Records what the directory's kernels were compiled for (after a successful warm-up)."""
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            meta = {"key": self.key, "environment": environment(), "describe": self.describe}
            (self.directory / "cache-meta.json").write_text(json.dumps(meta, indent=2, default=str))

    def save(self) -> Path | None:
        """Writes the metadata and the portable blob of everything compiled so far."""
        if self.directory is None:
            return None
        self.save_metadata()
        compat.compiler()  # what setup deferred (the blob's artifacts) loaded before torch gathers what it has
        artifacts = compat.save_cache_artifacts()
        dirs = (TRITON_DIR, self.precompiled_dir.name) + (() if artifacts is not None else ("inductor",))
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            if artifacts is not None:
                z.writestr(ARTIFACTS, artifacts)
            for sub in dirs:
                for path in _cache_files(self.directory / sub):
                    with contextlib.suppress(FileNotFoundError):  # renamed away meanwhile (an atomic write's temp)
                        z.write(path, path.relative_to(self.directory).as_posix())
        _write_atomic(self.blob_path, buf.getvalue())
        return self.blob_path

    def _unpack(self, blob: bytes) -> bool:
        """Writes the blob's cache files that the directory lacks, and leaves torch's artifacts for the first
        compile -> whether it held anything. A blob that is not ours raises (the caller logs and recompiles)."""
        root = self.directory.resolve()
        loaded = False
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            for name in z.namelist():
                if name == ARTIFACTS:
                    continue
                target = (root / name).resolve()
                if root not in target.parents:
                    raise ValueError(f"blob member {name!r} points outside the cache directory")
                if not target.exists():  # atomic: a start killed here, or one beside it, never sees half a file
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _write_atomic(target, z.read(name))
                loaded = True
            if ARTIFACTS in z.namelist():
                compat.before_first_compile(functools.partial(_load_artifacts, z.read(ARTIFACTS), self.blob_path))
                loaded = True
        return loaded


def _cache_files(root: Path) -> list[Path]:
    """The files under `root` a blob carries, sorted: not locks, not the temporary folders (`tmp.*`) in which Triton
    writes a kernel before renaming it into place: another process (early_kernels' workers, a second start) may be
    writing there while this one saves, and a folder that vanishes mid-walk is skipped (os.walk ignores it)."""
    found = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("tmp."))
        found += [Path(folder, n) for n in names if not n.endswith(".lock")]
    return sorted(found)


def _load_artifacts(data: bytes, blob: Path) -> None:
    """torch's compile artifacts of the blob, at the first compile; a failure only costs recompiles."""
    try:
        if not compat.load_cache_artifacts(data):
            log.warning("kernel cache blob %s: torch did not take its compile artifacts: recompiling", blob)
    except Exception as e:  # noqa: BLE001 - a bad blob only costs a recompile
        log.warning("kernel cache blob %s: its compile artifacts could not be loaded (%s): recompiling", blob, e)


def relink_triton_groups(triton_dir: Path) -> int:
    """Triton's cache lists each compiled kernel's files in a group file `KEY/__grp__NAME.json` by absolute path,
    and takes a kernel whose listed paths are missing for a miss: a cache unpacked from the blob or mounted at
    another path than where it was compiled (a volume, /opt/ml/model) compiled every Triton kernel again (seconds
    of a start). Points each missing path at the same file beside its group file, where a moved cache has
    it -> groups rewritten. A listed file that is missing there too is left: Triton compiles that kernel again."""
    fixed = 0
    for group in triton_dir.glob(GROUP_FILES) if triton_dir.is_dir() else ():
        try:
            data = json.loads(group.read_text())
            children = data["child_paths"]
            here = {name: str(group.parent / Path(path).name) for name, path in children.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a group file we understand: Triton decides what it is worth
        moved = {name: here[name] if not os.path.exists(path) and os.path.isfile(here[name]) else path
                 for name, path in children.items()}
        if moved == children:
            continue
        try:
            _write_atomic(group, json.dumps({**data, "child_paths": moved}).encode())
            fixed += 1
        except OSError:  # a read-only cache (baked into an image) keeps compiling those kernels: no worse than before
            pass
    return fixed


def _write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary file of this process beside `path`, then renames it into place: a reader (Triton,
    another engine starting on the same volume) sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # gone after the rename; on a read-only mount it never existed (EROFS)
            tmp.unlink(missing_ok=True)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _short(env: dict) -> str:
    return ", ".join(f"{k} {env[k]}" for k in ("gpu", "torch", "triton") if k in env) or "unknown"


def _difference(meta: dict, env: dict, describe: dict) -> str:
    """What a cache's metadata says it was built for, where that differs from now: the machine (gpu, torch, triton,
    ...) or the engine's settings (model, fused kernels, ...), e.g. "gpu NVIDIA A10G (this is NVIDIA L40S)"
    or "other settings: fused_kernels ['layer_gemv'] (now ['layer_gemv', 'pdl'])"."""
    built_env, built_describe = meta.get("environment", {}), meta.get("describe")
    changed = _changes(built_env, env, "this is")
    if changed:
        return changed
    changed = _changes(built_describe, describe, "now") if isinstance(built_describe, dict) else ""
    return f"other settings: {changed}" if changed else f"{_short(built_env)} with other settings"


def _changes(built: dict, now: dict, word: str) -> str:
    # "key built-value (word now-value)" for every key whose value differs, "; "-joined ("" when none does)
    return "; ".join(f"{k} {built.get(k)} ({word} {now.get(k)})" for k in sorted(set(built) | set(now))
                     if built.get(k) != now.get(k))
