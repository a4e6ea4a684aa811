"""A decode-step unit compiled ahead of time and kept in the kernel cache (torch's AOT precompile).

Inductor's cache spares a warm start the kernel compiles, but Dynamo still traces every compiled
unit again at each process start (fake-tensor propagation, guards, cache keys: seconds of a warm start;
docs/performance.md, "Start time and kernel cache"). torch >= 2.10 can save the traced function itself (bytecode,
guards and
Inductor's compiled graph); loading it takes milliseconds and traces nothing.

A unit holds variants, one per shape family (sampling runs over the vocabulary and over a
codebook) and batch kind (size 1: the one-row bucket; 2 and up, dynamic): a call runs the first
variant whose guards accept the arguments, else compiles a new one (the batch dim dynamic in
[2, max_batch], as units.Compiled) and saves it as `<dir>/<name>.<i>.pt2`. Whatever fails here
(no such API, a file torch rejects, a trace torch cannot serialize) logs one line and costs only
speed: the file is recompiled, or the unit goes on as a plain torch.compile unit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from ....compat import compiler
from .units import dynamic_batch

log = logging.getLogger(__name__)
MAX_VARIANTS = 64  # saved per unit (a few shape families x size 1 or dynamic x the GPUs of a fleet: guards check the
#                   device index)
_SAVING = threading.Lock()  # the engines of a fleet save into one directory: one picks an index and writes at a time


class Precompiled:
    def __init__(self, fn: Callable, name: str, batch_args: tuple[int, ...], max_batch: int, directory: Path,
                 fallback: Callable[[], Callable]):
        self.fn, self.name, self.batch_args, self.max_batch = fn, name, batch_args, max(max_batch, 3)
        self.directory = directory
        self._fallback_factory = fallback  # -> the plain torch.compile unit, built only when needed
        self._fallback: Callable | None = None
        self._variants: list | None = None  # loaded at the first call
        # what the saved function refers to but cannot pickle (the custom ops a closure holds); the
        # same objects are handed back at load
        cells = getattr(fn, "__closure__", None) or ()
        self._external = {f"cell{i}": c.cell_contents for i, c in enumerate(cells)
                          if isinstance(c.cell_contents, torch._ops.OpOverload)}
        self.loaded = self.compiled = 0  # variants read from disk / traced by this process

    def __call__(self, *args):
        if self._fallback is not None:
            return self._fallback(*args)
        if self._variants is None:
            self._variants = self._load()
        for i, variant in enumerate(self._variants):
            if variant.guard_check(*args):
                if i:  # most recently used first: in a fleet, other devices' variants come first on disk
                    self._variants.insert(0, self._variants.pop(i))
                return variant(*args)
        if len(self._variants) >= MAX_VARIANTS:
            return self._plain(f"it has {MAX_VARIANTS} variants already")(*args)
        try:
            variant = self._compile(args)
        except Exception as e:  # noqa: BLE001 - an unserializable trace costs the saving, not the compile
            return self._plain(f"{type(e).__name__}: {_first_line(e)}")(*args)
        self._variants.append(variant)
        return variant(*args)

    def _plain(self, why: str) -> Callable:
        log.warning("precompiled %s: %s; it is compiled the plain way in this process", self.name, why)
        self._fallback = self._fallback_factory()
        return self._fallback

    def _index(self, path: Path) -> int:
        """<name>.<i>.pt2 -> i (-1: not one of this unit's files)."""
        tail = path.name[len(self.name) + 1: -len(".pt2")]
        return int(tail) if tail.isdigit() else -1

    def _paths(self) -> list[Path]:
        return sorted((p for p in self.directory.glob(f"{self.name}.*.pt2") if self._index(p) >= 0), key=self._index)

    def _load(self) -> list:
        compiler()  # the compiler's import and what the kernel cache deferred to it (Inductor's artifacts)
        variants = []
        t0 = time.perf_counter()
        for path in self._paths():
            try:
                with path.open("rb") as f, _aot_enabled():
                    variant = torch.compiler.load_compiled_function(f, external_data=self._external)
            except Exception as e:  # noqa: BLE001 - e.g. a torch or GPU change, a torn file: trace again
                log.warning("precompiled %s: %s not loaded (%s: %s); it is compiled again", self.name, path.name,
                            type(e).__name__, _first_line(e))
                path.unlink(missing_ok=True)
                continue
            variant.disable_guard_check()  # __call__ checks the guards itself, once
            variants.append(variant)
        if variants:
            self.loaded = len(variants)
            log.info("precompiled %s: loaded %d variant(s) in %.2f s", self.name, len(variants),
                     time.perf_counter() - t0)
        return variants

    def _compile(self, args: tuple):
        _dynamo = compiler()  # imported here, at the first trace, with the recompile limit the runner asked for
        t0 = time.perf_counter()
        # a batch of one is its own static variant: marking a size-1 dim dynamic (min 2) fails Dynamo's constraints
        marked = [(t, set(vars(t))) for t in (args[i] for i in self.batch_args) if dynamic_batch(t)]
        for t, _ in marked:
            _dynamo.mark_dynamic(t, 0, min=2, max=self.max_batch)
        try:
            with _aot_enabled():
                variant = torch.compile(self.fn, fullgraph=True, dynamic=None).aot_compile((args, {}))
        finally:
            # a loaded variant's guards reject tensors that carry the marks: take off every attribute
            # mark_dynamic added (their names vary between torch releases)
            for t, before in marked:
                for attr in set(vars(t)) - before:
                    delattr(t, attr)
        variant.disable_guard_check()
        self.compiled += 1
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with _SAVING:  # written aside, then renamed: another process never reads half a file
                existing = self._paths()
                index = self._index(existing[-1]) + 1 if existing else 0
                path = self.directory / f"{self.name}.{index}.pt2"
                variant.save_compiled_function(str(path) + ".tmp", external_data=self._external)
                os.replace(str(path) + ".tmp", path)
        except OSError as e:  # a read-only or full volume: this process keeps the variant, the next traces again
            log.warning("precompiled %s: traced and compiled in %.1f s, not saved (%s)", self.name,
                        time.perf_counter() - t0, e)
            return variant
        log.info("precompiled %s: traced, compiled and saved variant %d in %.1f s", self.name, index,
                 time.perf_counter() - t0)
        return variant


def _aot_enabled():
    """torch 2.10-2.12 hide `aot_compile` behind a Dynamo flag (on by default from 2.13)."""
    from torch._dynamo import config

    return config.patch(enable_aot_compile=True) if hasattr(config, "enable_aot_compile") else nullcontext()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
