"""Our Triton kernels compiled ahead, in background processes, when a start finds the kernel cache without them
(feature early_kernels).

On an empty cache the engine's and the codec's threads compiled ~30 of our Triton kernels one at a time on the way
to the first audio (most of such a start's time: docs/speed.md has stop 66's census and the A/B). Which
ones is known before the start: kernel_manifest.py lists each one's specialization (signature, constant arguments,
attributes, options, target) as Triton serialized it on a GPU (scripts/device/record_kernels.py). build_ahead()
runs first thing in a start, before torch is imported: when the cache holds no Triton kernel and no blob, it spawns a
few processes (`python -m ttsengine.engine.device.compile.early_kernels K N`: the K-th of N shares) that compile
those entries into the cache's Triton directory while the start imports and loads; the threads then find them
there. The workers see no GPU (a CUDA context each would take memory the engine sizes its KV cache from): they
compile for the target the entry names.

An entry that no longer matches (a kernel's code or arguments changed since the recording, another GPU, another
Triton version) only costs a worker's time: the kernel compiles at its first use as it always did. Stdlib only down
to spawn(); the workers import Triton and the kernels' modules.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)
TRITON_DIR = "triton"  # the kernel cache's Triton subdirectory (kernel_cache.py points TRITON_CACHE_DIR at it)
MAX_PROCESSES = 8  # workers at most: ~30 kernels, the slowest ~1.5 s; more would only add imports
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where an NVIDIA GPU's driver is loaded


def triton_version() -> str | None:
    """The installed Triton's version without importing it (None: not installed)."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def entries(version: str | None) -> tuple[dict, ...]:
    """The manifest's entries when it was recorded with Triton `version` (another version's specializations differ),
    in the order the recording start compiled them; none otherwise."""
    from . import kernel_manifest as manifest

    return manifest.ENTRIES if version and manifest.TRITON == version else ()


def cache_lacks_kernels(cache_dir: Path) -> bool:
    """Nothing in the cache would give the start our kernels: no Triton kernel compiled there yet (each leaves a
    `__grp__*.json` in its folder) and no blob to unpack them from."""
    if any(cache_dir.glob("artifacts-*.bin")):
        return False
    return not any((cache_dir / TRITON_DIR).glob("*/__grp__*.json"))


def processes(cache_dir: Path | None, gpu: bool, cpus: int, version: str | None) -> int:
    """How many workers a start spawns: none without a GPU, a cache directory or entries for this Triton, or when
    the cache already has kernels; else one per two CPUs (the start's own threads need the rest), at most
    MAX_PROCESSES and one per entry."""
    if not gpu or cache_dir is None or not cache_lacks_kernels(cache_dir):
        return 0
    return min(MAX_PROCESSES, max(1, cpus // 2), len(entries(version)))


def build_ahead(cache_dir: Path | None, env: dict[str, str]) -> list[subprocess.Popen]:
    """Spawns the workers when processes() says so -> them (reaped by a daemon thread). env: the environment they
    inherit (config.with_env)."""
    n = processes(cache_dir, NVIDIA_DRIVER.exists(), os.cpu_count() or 1, triton_version())
    if n == 0:
        return []
    worker_env = {**env, "TRITON_CACHE_DIR": str(cache_dir / TRITON_DIR), "CUDA_VISIBLE_DEVICES": ""}
    workers = [subprocess.Popen([sys.executable, "-m", __name__, str(k), str(n)], env=worker_env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for k in range(n)]
    threading.Thread(target=lambda: [w.wait() for w in workers], name="tts-early-kernels", daemon=True).start()
    log.info("early_kernels: %d processes compiling %d Triton kernels into %s", n, len(entries(triton_version())),
             cache_dir / TRITON_DIR)
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
    obj = importlib.import_module(module)
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
    module_obj = importlib.import_module(module)
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


def run_share(k: int, n: int) -> tuple[int, list[str]]:
    """Compiles every n-th entry from the k-th -> (how many were tried, one line per failure)."""
    share = entries(triton_version())[k::n]
    failures = []
    for entry in share:
        try:
            compile_entry(entry)
        except Exception as e:  # noqa: BLE001 - a stale entry: the start compiles that kernel itself
            failures.append(f"{entry['kernel']}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return len(share), failures


def main(argv: list[str]) -> int:
    try:
        k, n = (int(a) for a in argv)
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        print("usage: python -m ttsengine.engine.device.compile.early_kernels K N (0 <= K < N)", file=sys.stderr)
        return 2
    tried, failures = run_share(k, n)
    if failures:  # one line: the start goes on, those kernels compile at first use
        print(f"early_kernels: {len(failures)} of {tried} kernels not built ahead (first: {failures[0]})",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
