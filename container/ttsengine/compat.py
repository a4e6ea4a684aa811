"""Differences between torch 2.2 (SageMaker's containers) and current torch/torchao, behind one module.

Everything here works by feature detection at call time; importing this module changes nothing.
"""

from __future__ import annotations

import functools
import logging
import pickle
import re
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import CheckpointError, ConfigError


@functools.cache
def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# ---- loading -----------------------------------------------------------------------------------
def load_torch_file(path: Path) -> object:
    """`torch.load` with `weights_only=True` always (2.2 defaults to False), mmap when the file allows.

    mmap needs the zip serialization format; old-format files are read without it.
    Unreadable files raise CheckpointError with one line naming the file.
    """
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)  # 2.2: str only
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        detail = re.search(r"Unsupported (global|class)[^.\n]*", text)
        if detail:  # a real pickle of something other than tensors: never unpickle it
            raise CheckpointError(f"{path}: refused to load: it holds objects other than tensors "
                                  f"({detail.group(0)})") from None
        last = text.strip().splitlines()[-1][:200] if text.strip() else "unpickling failed"
        raise CheckpointError(f"{path}: not a readable torch checkpoint (truncated or corrupt?): {last}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable torch checkpoint (truncated or corrupt?): {first}") from None


# ---- compile and graphs -------------------------------------------------------------------------
def custom_ops_available() -> bool:
    """`torch.library.custom_op` (2.4+): opaque ops torch.compile calls without tracing."""
    import torch.library

    return hasattr(torch.library, "custom_op")


def compiling() -> bool:
    """Whether torch.compile is tracing (torch.compiler.is_compiling; False on torch without it). A registered
    custom op is what a trace must see; an eager call takes the function itself: the op's dispatcher wrapper imports
    torch._dynamo at its first call (~1 s), which the path to a start's first audio then pays (feature
    lazy_compiler). torch's flag is process-wide for a whole compile, so an eager call on another thread meanwhile
    takes the op too: the same numbers, the compiler imported already."""
    return _IS_COMPILING is not None and bool(_IS_COMPILING())


_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


_RECOMPILE_LIMIT = [0]  # the largest torch._dynamo cache_size_limit asked for so far (compiler())
_BEFORE_COMPILE: list[Callable[[], None]] = []  # run once, at the first compiler() call
_COMPILER_LOCK = threading.RLock()  # the engine's and the codec's threads may both compile first


def compiler(recompile_limit: int = 0):
    """torch._dynamo, imported now (~1 s the first time: callers import it where a compile or a compiled unit's
    load is about to happen, not on a start's path), with its recompile limit raised to the largest
    `recompile_limit` any caller asked for and what before_first_compile deferred done."""
    from torch import _dynamo

    with _COMPILER_LOCK:
        _RECOMPILE_LIMIT[0] = max(_RECOMPILE_LIMIT[0], recompile_limit)
        _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, _RECOMPILE_LIMIT[0])
        deferred, _BEFORE_COMPILE[:] = list(_BEFORE_COMPILE), []
        for fn in deferred:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - each is a cache's or an option's: a failure costs recompiles
                logging.getLogger(__name__).warning("before the first compile: %s failed (%s: %s)",
                                                    getattr(fn, "__name__", fn), type(e).__name__, e)
    return _dynamo


def before_first_compile(fn: Callable[[], None]) -> None:
    """fn() at the first compiler() call, or now if the compiler is imported already (e.g. the kernel cache's
    Inductor options and artifacts: importing torch._inductor imports torch._dynamo too)."""
    with _COMPILER_LOCK:
        _BEFORE_COMPILE.append(fn)
    _now_if_imported()


def want_recompile_limit(n: int) -> None:
    """Asks for torch._dynamo's cache_size_limit to be at least n, applied now if the compiler is imported, else at
    its import through compiler() (the compile units' first compile)."""
    with _COMPILER_LOCK:
        _RECOMPILE_LIMIT[0] = max(_RECOMPILE_LIMIT[0], n)
    _now_if_imported()


def _now_if_imported() -> None:
    """compiler() at once when something has imported torch._dynamo already (nothing left to save by waiting)."""
    import sys

    if "torch._dynamo" in sys.modules:
        compiler()


def compile_supported() -> bool:
    """torch.compile of the decode step needs custom ops whose pool mutation Inductor re-inplaces
    (auto_functionalized_v2, torch >= 2.6); older versions would copy the whole KV pool each step."""
    return torch_version() >= (2, 6) and custom_ops_available()


def set_inductor_options(**options) -> dict[str, object]:
    """Sets the Inductor config keys this torch has; returns the ones it set (keys come and go
    between releases, e.g. fx_graph_cache is off by default before 2.5)."""
    import torch._inductor.config as inductor

    applied = {}
    for name, value in options.items():
        obj, attr = inductor, name
        if "." in name:  # nested, e.g. "triton.unique_kernel_names"
            head, attr = name.rsplit(".", 1)
            for part in head.split("."):
                obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, attr):
            setattr(obj, attr, value)
            applied[name] = value
    return applied


def precompile_supported() -> bool:
    """torch's AOT precompile (2.10+, experimental): `torch.compile(fn, fullgraph=True).aot_compile(...)`
    returns the traced and compiled function with its guards, `save_compiled_function` writes it and
    `torch.compiler.load_compiled_function(file, external_data=...)` loads it without a Dynamo trace."""
    import inspect

    load = getattr(getattr(torch, "compiler", None), "load_compiled_function", None)
    if load is None:
        return False
    try:
        return "external_data" in inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False


def cache_artifacts_supported() -> bool:
    """`torch.compiler.save_cache_artifacts` / `load_cache_artifacts` (2.7+): a portable compile cache."""
    compiler = getattr(torch, "compiler", None)
    return hasattr(compiler, "save_cache_artifacts") and hasattr(compiler, "load_cache_artifacts")


def save_cache_artifacts() -> bytes | None:
    if not cache_artifacts_supported():
        return None
    result = torch.compiler.save_cache_artifacts()
    return None if result is None else result[0]


def load_cache_artifacts(blob: bytes) -> bool:
    """-> whether the blob was loaded (False where unsupported or when torch rejects it, e.g. a bad
    checksum); other exceptions propagate (the caller logs and recompiles)."""
    if not cache_artifacts_supported():
        return False
    return torch.compiler.load_cache_artifacts(blob) is not None


# ---- torchao ------------------------------------------------------------------------------------
def torchao_version() -> tuple[int, int] | None:
    try:
        import torchao
    except Exception:  # noqa: BLE001 - absent, or fails to import against this torch
        return None
    parts = re.findall(r"\d+", getattr(torchao, "__version__", "0.0"))[:2]
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (0, 0)


def torchao_quantize(model: torch.nn.Module, mode: str, filter_fn) -> str | None:
    """Weight-only quantization of the nn.Linear layers `filter_fn(module, fqn)` selects, through
    whichever torchao API this install has: the Config classes (0.9+; preferred from 0.10, where
    the legacy functions are deprecated and later removed), `int8_weight_only()` style functions
    (0.4-0.12; on torch 2.2 with torchao 0.9 this is the path that also works under compile), or
    `change_linear_weights_to_int8_woqtensors` (0.1-0.3). -> the API used, or None without torchao."""
    version = torchao_version()
    if version is None:
        return None
    from torchao import quantization as q

    prefer_legacy = torch_version() < (2, 4) and hasattr(q, "int8_weight_only")
    if mode == "int8":
        if hasattr(q, "Int8WeightOnlyConfig") and not prefer_legacy:
            q.quantize_(model, q.Int8WeightOnlyConfig(), filter_fn=filter_fn)
            return "torchao Int8WeightOnlyConfig"
        if hasattr(q, "int8_weight_only"):
            q.quantize_(model, q.int8_weight_only(), filter_fn=filter_fn)
            return "torchao int8_weight_only()"
        if hasattr(q, "change_linear_weights_to_int8_woqtensors"):
            q.change_linear_weights_to_int8_woqtensors(model, filter_fn=filter_fn)
            return "torchao change_linear_weights_to_int8_woqtensors"
        return None
    if mode == "int4":
        if hasattr(q, "Int4WeightOnlyConfig"):
            packing = _int4_packing(q.Int4WeightOnlyConfig)
            extra = {"int4_packing_format": packing} if packing else {}
            q.quantize_(model, q.Int4WeightOnlyConfig(group_size=128, **extra), filter_fn=filter_fn)
            return "torchao Int4WeightOnlyConfig" + (f" ({packing})" if packing else "")
        if hasattr(q, "int4_weight_only"):
            q.quantize_(model, q.int4_weight_only(group_size=128), filter_fn=filter_fn)
            return "torchao int4_weight_only()"
        return None
    raise ConfigError(f"unknown quantization mode {mode!r}")


def _int4_packing(config_cls) -> str | None:
    """torchao >= 0.14's default int4 packing ("plain") runs on the separate `mslk` kernels package;
    without it, "tile_packed_to_4d" uses torch's own tinygemm kernel (aten._weight_int4pack_mm).
    None: keep torchao's default (older torchao, or mslk installed)."""
    import dataclasses
    import importlib.util

    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    if "int4_packing_format" not in names or importlib.util.find_spec("mslk") is not None:
        return None
    return "tile_packed_to_4d"

