"""The process's heap after start-up, out of the garbage collector's full passes (feature gc_freeze).

A server process holds a few hundred thousand Python objects that live as long as it does: torch's and Triton's
modules, the model's, the web framework's. Python's full (generation-2) collection scans every one of them, holding
the GIL for 0.1-0.2 s, and its trigger (survivors grown by a quarter) fires in a new server's first large burst,
when the loop, the planners and the codec thread all need the GIL (docs/performance.md, "Start time and kernel cache").
`freeze` collects what is garbage now, then moves every object still alive into the collector's permanent
generation: later full passes scan only what came after. Objects frozen are still freed by reference counting; a
cycle among them that dies later waits for `thaw` (an engine that froze calls it when it closes: tests and tools make
and close many) or the process's end. A thaw is the whole process's: an engine closing beside others that stay hands
their objects back too (a Fleet closes its engines together; tests close many beside a long-lived one: with a count
of holders instead, every closed engine's cycles would stay frozen for the session). So a freeze happens only in an
idle engine turn, after a quiet spell, with no request in flight.
At exit the objects are handed back, so the interpreter's last collection and the native libraries' leak checks see
them (nanobind, Triton's bindings, reports frozen objects as leaked).
"""

from __future__ import annotations

import atexit
import gc
import threading
import time

_lock = threading.Lock()
_at_exit = [False]


def freeze() -> tuple[float, int]:
    """Collects, then freezes every object alive -> (seconds it took, objects frozen in the process so far).
    Safe to call again (each call freezes what came since) and from any thread (it holds the GIL throughout)."""
    with _lock:
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        if not _at_exit[0]:
            atexit.register(gc.unfreeze)
            _at_exit[0] = True
        return time.perf_counter() - t0, gc.get_freeze_count()


def thaw() -> None:
    """Every frozen object back into the collector's reach (the next full pass scans them once again)."""
    with _lock:
        gc.unfreeze()
