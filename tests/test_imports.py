"""The dependency rules of DESIGN.md, enforced by walking every import statement (AST, no execution).

handlers -> ttsengine public API only (the package root and ttsengine.serving). Inside the core the layers go
serving -> engine -> synthesis -> model -> compat, and each folder's rule is in LAYERS below: the engine's control
plane (engine/control/) imports no torch, numpy, device, model or synthesis module; the speed features' registry
(engine/features.py) imports nothing of ours and no torch, and is the one module of ours config.py may import; model
never imports engine, synthesis, serving, config, handlers or the environment, and its math never imports its weight
I/O (model/loading/, which may import the math); audio imports nothing of ours but errors; tools are imported only by
the CLI; nothing in engine/ or serving/ imports the eager spec engine. The core never imports web frameworks or cloud
SDKs (one exception: `ttsengine download` imports boto3 inside its S3 function); only config.py reads the
environment; an adapter never imports another adapter.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

CORE = ROOT / "container" / "ttsengine"
HANDLERS = ROOT / "handlers"
FORBIDDEN_IN_CORE = ("runpod", "fastapi", "starlette", "uvicorn", "sagemaker", "sagemaker_inference", "boto3",
                     "botocore", "handlers")
# lazily, inside a function: the core imports without them
LAZY_SDK_ALLOWED = {"ttsengine.serving.download": ("boto3", "botocore"),
                    "ttsengine.serving.network.shutdown": ("uvicorn",)}  # the drain both uvicorn adapters run under
# module prefix -> what modules under it may not import (prefixes of absolute module names)
OURS = ("ttsengine.eager", "ttsengine.engine", "ttsengine.synthesis", "ttsengine.serving", "ttsengine.tools",
        "ttsengine.audio", "ttsengine.model", "ttsengine.config", "ttsengine.compat", "ttsengine.__main__")
LAYERS = {
    "ttsengine.model": ("ttsengine.eager", "ttsengine.engine", "ttsengine.synthesis", "ttsengine.serving",
                        "ttsengine.tools", "ttsengine.audio", "ttsengine.config", "ttsengine.__main__"),
    "ttsengine.synthesis": ("ttsengine.eager", "ttsengine.engine", "ttsengine.serving", "ttsengine.tools",
                            "ttsengine.__main__"),
    "ttsengine.engine": ("ttsengine.eager", "ttsengine.serving", "ttsengine.tools", "ttsengine.__main__"),
    "ttsengine.serving": ("ttsengine.eager", "ttsengine.tools", "ttsengine.__main__"),
    "ttsengine.audio": tuple(o for o in OURS if o != "ttsengine.audio"),
    "ttsengine.compat": tuple(o for o in OURS if o != "ttsengine.compat"),
    "ttsengine.eager": ("ttsengine.serving", "ttsengine.tools", "ttsengine.__main__"),
    "ttsengine.config": tuple(o for o in OURS if o != "ttsengine.config"),
}
LOADING = "ttsengine.model.loading"  # weight I/O: may import the math beside it; the math never imports it
DEVICE = "ttsengine.engine.device"  # runner, graphs, compile units, vocoder, the step in flight, device.py
CONTROL = "ttsengine.engine.control"  # torch-free: scheduler, page pool, prefix cache, prefill budget, faults, plan
FEATURES = "ttsengine.engine.features"  # the speed features' registry: plain data that config.py reads too
TOOL_USERS = ("ttsengine.__main__", "ttsengine.tools")  # tools are imported by the CLI and by each other only


def module_name(path: Path) -> str:
    base = CORE.parent if path.is_relative_to(CORE) else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """-> (absolute module imported, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out += [(f"{name}.{a.name}" if not node.module or node.level else name, id(node) in top_level)
                    for a in node.names]
    return out


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def handler_files() -> list[Path]:
    return sorted(HANDLERS.rglob("*.py")) if HANDLERS.is_dir() else []


def test_walker_sees_the_core():
    assert len(core_files()) > 20
    names = {n for f in core_files() for n, _ in imports(f)}
    assert "torch" in names and any(n.startswith("ttsengine.model") for n in names)


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(CORE)))
def test_core_rules(path):
    mod = module_name(path)
    for name, top in imports(path):
        root = name.split(".")[0]
        if root in LAZY_SDK_ALLOWED.get(mod, ()):
            assert not top, f"{mod} may import {root} only inside a function"
            continue
        assert root not in FORBIDDEN_IN_CORE, f"{mod} imports {name}"
        for layer, banned in LAYERS.items():
            if mod == layer or mod.startswith(layer + "."):
                allowed = mod == "ttsengine.config" and name == FEATURES
                assert allowed or not name.startswith(banned), f"{mod} ({layer}) imports {name}"
        if name.startswith("ttsengine.tools"):
            assert mod.startswith(TOOL_USERS), f"{mod} imports the tool {name}: tools are used by the CLI only"
        if _under(mod, "ttsengine.model") and not _under(mod, LOADING):  # math does not read weight files
            assert not _under(name, LOADING), f"{mod} (model math) imports {name}: weight I/O stays in {LOADING}"
        if mod.startswith(DEVICE + "."):  # the device plane reports through callbacks, never into a request's life
            assert not name.startswith(("ttsengine.synthesis", "ttsengine.engine.engine")), \
                f"{mod} (device plane) imports {name}"
        if mod.startswith(CONTROL + ".") or mod == CONTROL:  # the control plane: host-side Python, testable alone
            assert root not in ("torch", "numpy", "triton"), f"{mod} (control plane) imports {name}"
            assert not name.startswith(("ttsengine.engine.device", "ttsengine.model", "ttsengine.synthesis")), \
                f"{mod} (control plane) imports {name}: it may import only itself and ttsengine.errors"
        if mod == FEATURES:  # a leaf: the configuration imports it, so it imports nothing of ours, no torch
            assert root not in ("torch", "numpy", "triton", "ttsengine"), f"{mod} (the registry) imports {name}"
    source = path.read_text()
    if mod == "ttsengine.engine.device.compile.kernel_cache":  # points torch's caches at TTS_CACHE_DIR: writes only
        uses = [line.strip() for line in source.splitlines() if "os.environ" in line]
        assert uses and all(re.match(r'os\.environ\["[A-Z_]+"\] = ', u) for u in uses), uses
    elif mod != "ttsengine.config":
        assert "os.environ" not in source and "getenv" not in source, f"{mod} reads the environment"


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _public(name: str) -> bool:
    """`import ttsengine`, `from ttsengine import Engine` or anything from ttsengine.serving (what adapters share)."""
    parts = name.split(".")
    submodules = {p.stem for p in CORE.iterdir() if p.suffix == ".py" or p.is_dir()}
    return name == "ttsengine" or name.startswith("ttsengine.serving") or (
        len(parts) == 2 and parts[1] not in submodules)


@pytest.mark.parametrize("path", handler_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_handler_rules(path):
    mod = module_name(path)
    parts = mod.split(".")
    adapter = parts[1] if len(parts) > 1 and parts[1] != "__main__" else None
    for name, top in imports(path):
        if name.startswith("ttsengine"):
            assert _public(name), f"{mod} imports {name}: adapters use the public API (ttsengine, ttsengine.serving)"
        if name.startswith("handlers.") and adapter:
            assert name.split(".")[1] == adapter, f"adapter {adapter} imports {name}"
        if mod == "handlers.__main__" and name.startswith("handlers."):
            assert not top, "handlers/__main__.py imports only the chosen adapter, lazily"


@pytest.mark.parametrize("folder", sorted({p.parent for p in core_files()}), ids=lambda p: str(p.relative_to(CORE)))
def test_no_core_folder_holds_more_than_twelve_modules(folder):
    # one concern per folder: a folder that grows past a dozen modules is split into nouns of its own (issue 42)
    modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 12, f"{folder.relative_to(CORE)} holds {len(modules)} modules: {modules}"
