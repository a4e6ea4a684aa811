"""Shared fixtures: the tiny golden set (tests/assets/golden) and one CPU engine per session."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
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
def eager_engine():
    """The eager reference engine on CPU."""
    from ttsengine import EagerEngine, EngineConfig

    return EagerEngine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


@pytest.fixture(scope="session")
def engine():
    """The batched serving engine on CPU (eager: no CUDA graphs, reference attention)."""
    from ttsengine import Engine, EngineConfig

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def s3_server():
    """A local moto S3 server: yields the environment that points boto3 at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    server.stop()


def s3_client(env: dict):
    import boto3

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


def complete_model(dest: Path) -> Path:
    """A copy of the tiny checkpoint, a complete model dir (its codec_config.json inside, as a real one has it)."""
    import shutil

    shutil.copytree(MODEL_DIR, dest)
    return dest


class Recorder:
    """Stands in for a Stream where the codec delivers: keeps a copy of each chunk emitted, and its end's error."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.error = None

    def emit(self, audio, text_index: int) -> None:
        self.chunks.append(np.array(audio))

    def finish(self, error=None) -> None:
        self.error = error


def free_port(below: int = 65536) -> int:
    """A free local port; `below` for servers that reject high ones (MMS takes at most 32767)."""
    for _ in range(200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 0 if below == 65536 else random.randrange(20000, below)))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port below {below}")


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m <args>` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)


# `python -m pytest -m quick` (README, "Run the tests"): a few minutes on 2 cores instead of ~13; the unit tests of
# every layer plus one real server walk-through, for a first run or a tight loop. The full suite is what CI runs.
QUICK = (
    "test_config.py", "test_docs.py", "test_imports.py", "test_compat.py",
    "model/test_tokenizer.py", "model/test_families.py", "model/test_sampling_blocked.py",
    "synthesis/test_text_chunks.py", "synthesis/test_captions.py", "synthesis/test_plan.py",
    "engine/test_scheduler.py", "engine/test_prefill_budget.py", "engine/test_features.py", "engine/test_settings.py",
    "serving/test_protocol.py", "serving/test_protocol_dropin.py", "serving/test_download.py",
    "handlers/test_runpod_input.py", "handlers/test_sagemaker_input.py", "handlers/test_walkthrough.py",
)


def pytest_collection_modifyitems(config, items):
    """`quick` marks the QUICK files' tests; `gpu` tests run only where CUDA is available (the device machine); CI is
    CPU-only."""
    import torch

    tests = Path(__file__).resolve().parent
    quick = {tests / name for name in QUICK}
    for item in items:
        if Path(str(item.fspath)).resolve() in quick:
            item.add_marker(pytest.mark.quick)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
