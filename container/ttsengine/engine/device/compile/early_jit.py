"""Triton's keys made beside the weight load (feature early_jit).

Before a kernel's first launch in a process can look in the kernel cache, Triton computes its own compiler key (a
sha256 of its ~500 MB library and its sources, once per process: ~0.3 s in stop 67's py-spy of a warm start) and the
kernel's key (its source parsed for the JIT functions and globals it uses), on the engine's and the codec's threads,
which then take the GIL in turn. key_kernels_ahead() makes both on a thread of its own while the start reads and
uploads its weights; the warm-up waits for it (wait_for_keys). The kernels are those of early_kernels.py's manifest.
"""

from __future__ import annotations

import contextlib
import threading

from .early_kernels import kernel, quant_entries, triton_version

_KEYING: list[threading.Thread] = []  # the keying thread of this process, while it runs


def key_kernels_ahead(quant: str) -> threading.Thread | None:
    """Starts the daemon thread that makes Triton's compiler key and the keys of the manifest's kernels a start of
    `quant` launches (their keys depend on their source, not on the GPU or the Triton that recorded the manifest) ->
    the thread; None where Triton is not installed."""
    if triton_version() is None:
        return None
    paths = dict.fromkeys(e["kernel"] for e in quant_entries(quant))
    # the JIT functions are found here, on the caller's thread: some come from factories that rebind their module's
    # names at their first call (small_linear), which the engine's threads make too; two first calls at once break them
    jits = []
    for path in paths:
        with contextlib.suppress(Exception):  # a stale entry: its first launch keys it, as without this thread
            jits.append(kernel(path))
    thread = threading.Thread(target=_key_kernels, args=(jits,), name="tts-early-jit", daemon=True)
    _KEYING.append(thread)
    thread.start()
    return thread


def wait_for_keys(timeout: float = 10.0) -> None:
    """Until the keying thread (if any) is done: the first launch should not compute the same keys beside it (after
    `timeout` it goes on: the keys it finds made are made, the rest its launches make, as without the thread)."""
    while True:
        try:
            thread = _KEYING.pop()
        except IndexError:  # none left (another engine's warm-up may have taken it)
            return
        thread.join(timeout)


def _key_kernels(jits: list) -> None:
    """Triton's compiler key (a functools cache) and each kernel's key (computed under the JIT function's own lock)."""
    with contextlib.suppress(Exception):  # another Triton's layout: the first launch computes it, as without
        from triton.runtime.cache import triton_key

        triton_key()
    for jit in jits:
        # a property, computed once and kept on the JIT function; a Triton without its lock (older releases) shows a
        # placeholder key while computing one, which a launch beside would take: those are left to the launch
        if hasattr(jit, "_hash_lock"):
            with contextlib.suppress(Exception):
                _ = jit.cache_key
