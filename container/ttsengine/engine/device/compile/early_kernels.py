"""Our Triton kernels compiled ahead, in background processes, when a start finds the kernel cache without them
(feature early_kernels).

On an empty cache the engine's and the codec's threads compiled ~30 of our Triton kernels one at a time on the way
to the first audio (most of such a start's time: docs/speed.md has stop 66's census and the A/B). Which
ones is known before the start: kernel_manifest.py lists each one's specialization (signature, constant arguments,
attributes, options, target) as Triton serialized it on a GPU (scripts/device/triton_census.py --record). build_ahead()
runs first thing in a start, before torch is imported: when the cache holds no Triton kernel and no blob, it spawns a
few processes (`python -m ttsengine.engine.device.compile.early_kernels K N QUANT`: the K-th of N shares of the
entries a start with that quantization uses) that compile them into the cache's Triton directory while the start
imports and loads; the threads then find them there. The workers see no GPU (a CUDA context each would take memory
the engine sizes its KV cache from): they compile for the target the manifest names.

An entry that no longer matches (a kernel's code or arguments changed since the recording, another GPU, another
Triton version) only costs a worker's time: the kernel compiles at its first use as it always did. Stdlib only down
to build_ahead(); the workers import Triton and the kernels' modules.
The manifest's kernel names serve every GPU start too (early_jit.py).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

# the kernel cache's layout (kernel_cache.py uses these; here, where no torch is imported):
TRITON_DIR = "triton"  # its Triton subdirectory (TRITON_CACHE_DIR)
GROUP_FILES = "*/__grp__*.json"  # under TRITON_DIR: one group file per compiled kernel, listing its files
BLOB = "artifacts-{key}.bin"  # the portable blob, per cache key
MAX_PROCESSES = 8  # workers at most: ~30 kernels, the slowest ~1.5 s; more would only add imports
WORKER_LIMIT_S = 300  # a worker ends itself after this long (a hung compile must not outlive the start by much)
WORKER_NICENESS = 10  # added to a worker's: the start's own threads (the load's CPU conversions) come first
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where an NVIDIA GPU's driver is loaded
CGROUP_CPU = Path("/sys/fs/cgroup/cpu.max")  # a container's CPU quota (cgroup v2): "QUOTA PERIOD" or "max PERIOD"
KERNELS = "ttsengine.model.kernels"  # the package whose modules hold our Triton kernels and their JIT helpers
_IMPORT = re.compile(r"^\s*from (\.+)(\w*) import ([\w, ]+)", re.M)


def triton_version() -> str | None:
    """The installed Triton's version without importing it (None: not installed)."""
    import importlib.metadata  # here: ~15 ms a start without a GPU need not pay

    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_arch() -> int | None:
    """The first GPU's compute capability as Triton names targets (90 for 9.0), asked of nvidia-smi (no CUDA in this
    process: it has not imported torch yet); None when that cannot be told."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        major, minor = out[0].split(".")
        return int(major) * 10 + int(minor)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def cpus(quota_file: Path = CGROUP_CPU) -> int:
    """CPUs this process may use: its affinity, and a container's CPU quota where one is set."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = quota_file.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def base_quant(quant: str) -> str:
    """TTS_QUANT's value as the manifest tags entries: 'none' is bf16."""
    return "bf16" if quant == "none" else quant


def quant_entries(quant: str) -> tuple[dict, ...]:
    """The manifest's entries a start with `quant` uses, whichever Triton recorded them, in the order the recording
    compiled them. Each entry names the quantization of the recording that first compiled it: a bf16 recording's are
    every start's (an int8 start uses most of them too), the others only their own quantization's."""
    from . import kernel_manifest as manifest

    return tuple(e for e in manifest.ENTRIES if e["quant"] in ("bf16", base_quant(quant)))


def entries(version: str | None, quant: str = "bf16") -> tuple[dict, ...]:
    """quant_entries(quant) when the manifest was recorded with Triton `version` (another version's specializations
    differ); none otherwise."""
    from . import kernel_manifest as manifest

    if not version or manifest.TRITON != version:
        return ()
    return quant_entries(quant)


def source_fingerprint(module: str) -> str:
    """A hash of a kernel module's text and of the modules of our kernels package it imports from. Triton's cache key
    holds a kernel's source, its starting line and its JIT helpers' sources: a change to any of those makes a recorded
    entry compile a kernel the start never asks for (tests/engine/compile/test_early_kernels.py compares these with
    the manifest's, so the manifest is recorded again)."""
    files = {Path(importlib.util.find_spec(module).origin)}
    for dots, name, names in _IMPORT.findall(next(iter(files)).read_text()):
        base = module.rsplit(".", len(dots))[0]
        for target in [f"{base}.{name}"] if name else [f"{base}.{n.strip()}" for n in names.split(",")]:
            spec = importlib.util.find_spec(target) if target.startswith(KERNELS + ".") else None
            if spec is not None and spec.origin:
                files.add(Path(spec.origin))
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_lacks_kernels(cache_dir: Path) -> bool:
    """Nothing in the cache would give the start our kernels: no Triton kernel compiled there yet (each leaves a
    `__grp__*.json` in its folder) and no blob to unpack them from."""
    if any(cache_dir.glob(BLOB.format(key="*"))):
        return False
    return not any((cache_dir / TRITON_DIR).glob(GROUP_FILES))


def processes(cpu_count: int, version: str | None, arch: int | None, quant: str = "bf16") -> int:
    """How many workers a start on a GPU whose cache lacks our kernels spawns: none without entries for this Triton,
    or when the GPU is not the one they were recorded for (they would compile kernels nobody loads); else one per two
    CPUs (the start's own threads need the rest), at most MAX_PROCESSES and one per entry."""
    from . import kernel_manifest as manifest

    if arch is None or arch != manifest.TARGET.get("arch"):
        return 0
    return min(MAX_PROCESSES, max(1, cpu_count // 2), len(entries(version, quant)))


def build_ahead(cache_dir: Path, quant: str, env: dict[str, str]) -> list[subprocess.Popen]:
    """Spawns the workers where a GPU start's cache lacks our kernels and processes() says so -> them (reaped by a
    daemon thread; those still running when this process exits are ended). env: the environment they inherit. The
    cheap checks first: a start without a GPU or with a filled cache pays a file test."""
    if not NVIDIA_DRIVER.exists() or not cache_lacks_kernels(cache_dir):
        return []
    n = processes(cpus(), triton_version(), gpu_arch(), quant)
    worker_env = {**env, "TRITON_CACHE_DIR": str(cache_dir / TRITON_DIR), "CUDA_VISIBLE_DEVICES": ""}
    workers: list[subprocess.Popen] = []
    try:
        for k in range(n):
            workers.append(subprocess.Popen([sys.executable, "-m", __name__, str(k), str(n), quant], env=worker_env,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
    finally:  # a failed spawn: the ones started are still reaped and ended
        if workers:
            threading.Thread(target=lambda: [w.wait() for w in workers], name="tts-early-kernels",
                             daemon=True).start()
            atexit.register(lambda: [w.terminate() for w in workers if w.poll() is None])
    return workers


# ---- in a worker (imports Triton) -------------------------------------------------------------------------------
def _jit(obj):
    """The JITFunction inside autotuner or heuristics wrappers."""
    while not hasattr(obj, "cache_key") and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def kernel(path: str):
    """'module:qualname' -> the JITFunction. 'module:factory.<locals>.name': one that a zero-argument (cached) factory
    makes: the factory is called, and its kernel of that name taken from what it returns."""
    module, _, qualname = path.partition(":")
    obj = module_obj = importlib.import_module(module)
    outer, made_by, inner = qualname.partition(".<locals>.")
    for part in outer.split("."):
        obj = getattr(obj, part)
    if made_by:
        found = [k for k in _made(obj) if getattr(getattr(k, "fn", None), "__name__", None) == inner]
        if not found:
            raise LookupError(f"{outer}() makes no kernel named {inner}")
        return found[0]
    if hasattr(_jit(obj), "cache_key"):
        return _jit(obj)
    # a module-level function that one of the module's cached factories jits (small_linear's kernels)
    for factory in vars(module_obj).values():
        if callable(factory) and hasattr(factory, "cache_info") and not inspect.signature(factory).parameters:
            found = [k for k in _made(factory) if getattr(k, "fn", None) is obj]
            if found:
                return found[0]
    raise LookupError(f"{path} is not a Triton kernel, nor made into one by a factory of its module")


def _made(factory) -> list:
    """The JITFunctions a zero-argument factory returns (one, or a tuple of them)."""
    made = factory()
    return [_jit(k) for k in (made if isinstance(made, (tuple, list)) else (made,))]


def _tuples(value):
    """JSON's lists back into the tuples Triton keys its cache with (lists never occur in a specialization)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _constant(value):
    """One serialized constant argument -> its value: a Triton dtype (by name), a constexpr, a JIT function."""
    import triton.language as tl

    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_tuples(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        return kernel(value["jit_function"])
    if isinstance(value, str) and getattr(tl.dtype, "is_dtype", lambda _: False)(value):
        return tl.dtype(value)
    return _tuples(value)


def compile_entry(entry: dict) -> None:
    """Compiles one entry into TRITON_CACHE_DIR for the manifest's target (Triton's cache key is the kernel's source,
    this specialization, the options and the target: the start's own compile then finds it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import kernel_manifest as manifest

    constants = {_tuples(k): _constant(v) for k, v in entry["constants"]}
    attrs = {_tuples(k): v for k, v in entry["attrs"]}
    signature = {k: _tuples(v) for k, v in entry["signature"].items()}
    options = {k: _tuples(v) for k, v in {**manifest.OPTIONS, **entry["options"]}.items()}
    source = ASTSource(kernel(entry["kernel"]), signature, constants, attrs)
    triton.compile(source, target=GPUTarget(**manifest.TARGET), options=options)


def run_share(k: int, n: int, quant: str) -> tuple[int, list[str]]:
    """Compiles every n-th entry from the k-th -> (how many were tried, one line per failure)."""
    share = entries(triton_version(), quant)[k::n]
    failures = []
    for entry in share:
        try:
            compile_entry(entry)
        except Exception as e:  # noqa: BLE001 - a stale entry: the start compiles that kernel itself
            failures.append(f"{entry['kernel']}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return len(share), failures


def lower_priority() -> None:
    """This worker yields the CPU to the start beside it (background work; where lowering is refused it runs at the
    start's priority, as before). Stop 66's workers slowed the load's codec conversion from 1.0 to 3.5-4.2 s; stop
    67's, lowered, still left it at 3.4-3.9 s: not the CPU's share, then (docs/speed.md)."""
    if hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(WORKER_NICENESS)


def main(argv: list[str]) -> int:
    if hasattr(signal, "alarm"):
        signal.alarm(WORKER_LIMIT_S)  # SIGALRM ends the worker: a start waits for none of them
    lower_priority()
    try:
        k, n, quant = int(argv[0]), int(argv[1]), argv[2]
        if not 0 <= k < n or len(argv) != 3:
            raise ValueError
    except (ValueError, IndexError):
        print("usage: python -m ttsengine.engine.device.compile.early_kernels K N QUANT (0 <= K < N)", file=sys.stderr)
        return 2
    tried, failures = run_share(k, n, quant)
    if failures:  # one line: the start goes on, those kernels compile at first use
        print(f"early_kernels: {len(failures)} of {tried} kernels not built ahead (first: {failures[0]})",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
