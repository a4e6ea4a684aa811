"""Which Triton kernels a command compiles in this process, on which thread, and how long each took: runs a Python
module (`-m NAME args...`) with triton's compile entry points wrapped, then prints to stderr a table (calls, cache
loads, compiles, seconds per thread, the slowest compiles) and writes every call as JSON lines to $CENSUS (optional).
Kernels compiled in subprocesses (Inductor's worker pool) are not seen; their loads in this process are.
Usage: python3 scripts/device/triton_census.py -m ttsengine warm --model DIR --until-first-audio
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import runpy
import sys
import threading
import time

LOADED_S = 0.05  # a call this short found its kernel in Triton's cache directory (a compile takes ~0.2 s and more)
T0 = time.perf_counter()
calls: list[dict] = []


def name_of(src) -> str:
    fn = getattr(src, "fn", None)
    return getattr(fn, "__name__", None) or getattr(src, "name", None) or type(src).__name__


def wrap(compile_fn):
    def compile(src, *args, **kwargs):
        t = time.perf_counter()
        try:
            return compile_fn(src, *args, **kwargs)
        finally:
            calls.append({"name": name_of(src), "thread": threading.current_thread().name, "at_s": t - T0,
                          "seconds": time.perf_counter() - t})
    return compile


def install() -> None:
    import triton
    import triton.compiler
    import triton.compiler.compiler as cc

    original = cc.compile
    wrapped = wrap(original)
    for module in (triton, triton.compiler, cc):
        if getattr(module, "compile", None) is original:
            module.compile = wrapped


def report() -> None:
    print = functools.partial(builtins.print, file=sys.stderr, flush=True)  # noqa: A001 - the module may close stdout
    built = [c for c in calls if c["seconds"] >= LOADED_S]
    print(f"triton census: {len(calls)} compile calls, {len(calls) - len(built)} loaded from the cache, "
          f"{len(built)} compiled ({sum(c['seconds'] for c in built):.1f} s)")
    threads: dict[str, list[float]] = {}
    for c in built:
        threads.setdefault(c["thread"], []).append(c["seconds"])
    for thread, secs in sorted(threads.items(), key=lambda kv: -sum(kv[1])):
        print(f"  thread {thread}: {len(secs)} compiles, {sum(secs):.1f} s")
    if built:
        first, last = min(c["at_s"] for c in built), max(c["at_s"] + c["seconds"] for c in built)
        print(f"  compiles between {first:.1f} s and {last:.1f} s of the process")
    print("  slowest: " + ", ".join(f"{c['name']} {c['seconds']:.2f}" for c in
                                    sorted(built, key=lambda c: -c["seconds"])[:12]))
    if os.environ.get("CENSUS"):
        with open(os.environ["CENSUS"], "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in calls)


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        print("usage: triton_census.py -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    install()
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        report()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
