"""Shared fixtures: the tiny golden set (tests/assets/golden) and one CPU engine per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():  # Triton kernels run in its interpreter on CPU-only machines
        os.environ["TRITON_INTERPRET"] = "1"
GOLDEN = ROOT / "tests" / "assets" / "golden"
MODEL_DIR = GOLDEN / "checkpoint"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return MODEL_DIR


@pytest.fixture(scope="session")
def ref_engine():
    """The eager reference engine on CPU."""
    from ttsengine import EngineConfig, ReferenceEngine

    return ReferenceEngine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


@pytest.fixture(scope="session")
def engine():
    """The batched serving engine on CPU (eager: no CUDA graphs, reference attention)."""
    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8))
    yield eng
    eng.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m <args>` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where CUDA is available (the device machine); CI is CPU-only."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
