"""Which Triton kernels a command compiles in this process, on which thread, and how long each took: runs a Python
module (`-m NAME args...`) with triton's compile entry points wrapped, then prints to stderr a table (calls, cache
loads, compiles, seconds per thread, the slowest compiles) and writes every call as JSON lines to $CENSUS (optional).
Kernels compiled in subprocesses (Inductor's worker pool) are not seen; their loads in this process are.
--record FILE: also keeps the specialization Triton serializes for each of our kernels it compiles (its post-compile
hook) and writes FILE as engine/device/compile/kernel_manifest.py's format (feature early_kernels), merged with the
entries FILE already has (a second run, e.g. int8, adds its kernels, tagged with its TTS_QUANT: record bf16 first).
--until-ready PORT: for a server (`-m handlers http`, with TTS_ENGINE_PROCESS=off so its engine compiles in this
process): once its /ready answers 200 (every graph a burst needs captured), the table and FILE are written and the
server is sent SIGTERM: the kernels a settled start compiles, beyond those of its first audio.
Usage: python3 scripts/device/triton_census.py [--record FILE] [--until-ready PORT] -m ttsengine warm --model DIR
  --until-first-audio
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
from pathlib import Path

LOADED_S = 0.05  # a call this short found its kernel in Triton's cache directory (a compile takes ~0.2 s and more)
T0 = time.perf_counter()
calls: list[dict] = []
recorded: list[dict] = []  # manifest entries: kernel, source, quant, signature, constants, attrs, options


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


def record_hook(**kw):
    """Triton's jit_post_compile_hook: our kernels' serialized specializations. A kernel made inside a function is
    kept only when a zero-argument factory makes it ('factory.<locals>.name': early_kernels.kernel finds it again)."""
    fn, data = kw["fn"], kw["compile"].get("specialization_data")
    if data and fn.module.startswith("ttsengine.") and fn.name.count("<locals>") <= 1:
        spec = json.loads(data)
        from ttsengine.config import from_env
        from ttsengine.engine.device.compile.early_kernels import base_quant, source_fingerprint

        recorded.append({"kernel": f"{fn.module}:{fn.name}", "source": source_fingerprint(fn.module),
                         "quant": base_quant(from_env().quant),  # the run's: which starts use it (entries())
                         "signature": spec["signature"],
                         "constants": [list(kv) for kv in zip(spec["constant_keys"], spec["constant_vals"])],
                         "attrs": [list(kv) for kv in zip(spec["attrs_keys"], spec["attrs_vals"])],
                         # extern_libs names the recording machine's libdevice path: left to each process's default
                         "options": {k: v for k, v in spec["options"].items() if k != "extern_libs"}})
    return None


def write_manifest(path: str) -> None:
    """The manifest (engine/device/compile/kernel_manifest.py): this Triton and target, the options every entry
    shares, the entries with the rest of theirs; an existing file's entries kept when it has the same Triton and
    target and its kernel's sources are unchanged (early_kernels.source_fingerprint), new ones after them."""
    import torch
    import triton
    from triton.runtime import driver

    t = driver.active.get_current_target()
    target = {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}
    old: list[dict] = []
    if os.path.exists(path):
        scope: dict = {}
        exec(Path(path).read_text(), scope)  # noqa: S102 - our own generated file
        if scope.get("TRITON") == triton.__version__ and scope.get("TARGET") == target:
            from ttsengine.engine.device.compile.early_kernels import source_fingerprint

            old = [{**e, "options": {**scope["OPTIONS"], **e["options"]}} for e in scope["ENTRIES"]
                   if e.get("source") == source_fingerprint(e["kernel"].partition(":")[0])]

    def same(e: dict) -> str:  # one specialization, whichever run recorded it first (that run's quant stays)
        return json.dumps({k: v for k, v in e.items() if k != "quant"}, sort_keys=True)

    seen = {same(e) for e in old}
    merged = old + [e for e in recorded if same(e) not in seen and not seen.add(same(e))]
    shared = dict(merged[0]["options"]) if merged else {}
    for e in merged[1:]:
        shared = {k: v for k, v in shared.items() if e["options"].get(k, object()) == v}
    entries = [{**e, "options": {k: v for k, v in e["options"].items() if k not in shared}} for e in merged]
    Path(path).write_text(render(torch.__version__, triton.__version__, target, shared, entries))
    print(f"triton census: {len(recorded)} recorded, {len(merged) - len(old)} new, {len(merged)} in {path}",
          file=sys.stderr)


def render(torch_version: str, triton_version: str, target: dict, shared: dict, entries: list[dict]) -> str:
    """kernel_manifest.py's text. No GPU name in it: production files carry none (tests/test_docs.py)."""
    import pprint

    fmt = functools.partial(pprint.pformat, width=120, compact=True, sort_dicts=False)  # a signature's order counts
    return (f'"""Generated by scripts/device/triton_census.py --record with torch {torch_version}, Triton '
            f'{triton_version}, sm_{target["arch"]}:\nthe specializations of our Triton kernels that a start on an '
            'empty kernel cache compiles (real S1-mini shapes),\nin the order they were compiled; early_kernels.py '
            'builds them ahead. Do not edit: record again."""\n# ruff: noqa: E501\n\n'
            f"TRITON = {triton_version!r}\nTARGET = {fmt(target)}\nOPTIONS = {fmt(shared)}\n"
            "ENTRIES = (\n" + "".join(fmt(e) + ",\n" for e in entries) + ")\n")


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


def finish(record: str | None) -> None:
    report()
    if record:
        write_manifest(record)


def stop_when_ready(port: str, record: str | None) -> None:
    """On a thread: polls the server's /ready; at its first 200, finish() and SIGTERM to this process."""
    import signal
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
                if r.status == 200:
                    break
        except Exception:  # noqa: BLE001 - not up yet: refused, or 503 while it warms
            pass
        time.sleep(0.5)
    finish(record)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    options: dict[str, str] = {}
    while len(sys.argv) > 2 and sys.argv[1] in ("--record", "--until-ready"):
        options[sys.argv[1]] = sys.argv[2]
        del sys.argv[1:3]
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        print("usage: triton_census.py [--record FILE] [--until-ready PORT] -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    record = options.get("--record")
    install()
    if record:
        from triton import knobs

        knobs.runtime.jit_post_compile_hook = record_hook
    if "--until-ready" in options:
        threading.Thread(target=stop_when_ready, args=(options["--until-ready"], record), daemon=True).start()
    module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if "--until-ready" not in options:  # a server's table was written at its /ready
            finish(record)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
