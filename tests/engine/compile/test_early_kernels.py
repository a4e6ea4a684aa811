"""Feature early_kernels (engine/device/compile/early_kernels.py) on the CPU: when a start spawns workers (a GPU's
driver, a cache without our kernels, a manifest of this Triton), that the manifest still matches our kernels (each
entry found again, its arguments the kernel's), the spawn from the package root before torch is imported, and the
worker's command line. That the workers' kernels are the ones the start then loads was measured on the device
(docs/speed.md, "Stop 66"): the compile itself needs the GPU's toolchain and a recorded target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from ttsengine.engine.device.compile import early_kernels, kernel_manifest
from ttsengine.model.kernels.triton_support import triton_major

RECORDED = kernel_manifest.TRITON


def test_workers_only_where_a_gpu_start_would_compile_our_kernels(tmp_path):
    n = len(kernel_manifest.ENTRIES)
    assert n > 0 and RECORDED  # the manifest is a recording, not a placeholder
    assert early_kernels.processes(tmp_path, True, 32, RECORDED) == min(early_kernels.MAX_PROCESSES, 16, n)
    assert early_kernels.processes(tmp_path, True, 2, RECORDED) == 1  # a small machine: one worker beside the start
    assert early_kernels.processes(tmp_path, False, 32, RECORDED) == 0  # no GPU driver
    assert early_kernels.processes(None, True, 32, RECORDED) == 0  # no cache directory to fill
    assert early_kernels.processes(tmp_path, True, 32, "0.0.1") == 0  # another Triton: its specializations differ
    assert early_kernels.processes(tmp_path, True, 32, None) == 0  # no Triton
    group = tmp_path / "triton" / "abc"
    group.mkdir(parents=True)
    assert early_kernels.processes(tmp_path, True, 32, RECORDED) > 0  # an empty folder is no kernel
    (group / "__grp__kernel.json").write_text("{}")
    assert early_kernels.processes(tmp_path, True, 32, RECORDED) == 0  # the cache has kernels: a restart
    (group / "__grp__kernel.json").unlink()
    (tmp_path / "artifacts-0123.bin").write_bytes(b"blob")
    assert early_kernels.processes(tmp_path, True, 32, RECORDED) == 0  # the blob brings them


CHECK = """
import inspect
from ttsengine.engine.device.compile import early_kernels, kernel_manifest
for entry in kernel_manifest.ENTRIES:
    jit = early_kernels.kernel(entry["kernel"])
    names = list(inspect.signature(jit.fn).parameters)
    assert list(entry["signature"]) == names, (entry["kernel"], names)
    for index, _ in entry["constants"] + entry["attrs"]:
        assert 0 <= index[0] < len(names), entry["kernel"]
    assert set(entry["options"]) <= {"num_warps", "num_stages", "launch_pdl", "num_ctas", "maxnreg"}, entry
assert "extern_libs" not in kernel_manifest.OPTIONS  # a machine's path: each process keeps its own default
print(len(kernel_manifest.ENTRIES), "entries")
"""


@pytest.mark.skipif(triton_major() < 3, reason="the kernels' factories need Triton 3")
def test_every_manifest_entry_is_still_one_of_our_kernels():
    """An entry whose kernel moved or whose arguments changed would only cost a worker its time; this catches it
    here, so the manifest is recorded again (scripts/device/triton_census.py --record) with the change. In a fresh
    interpreter without the tests' TRITON_INTERPRET (which makes interpreter functions, not JIT functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and f"{len(kernel_manifest.ENTRIES)} entries" in run.stdout, run.stderr[-3000:]


def test_the_spawn_runs_before_torch_and_its_workers_finish(tmp_path):
    """build_kernels_ahead() from the package root in a fresh interpreter, with the GPU driver's file and this
    Triton's version standing in for a GPU machine with the recorded Triton: workers spawned before torch is
    imported, pointed at the cache's Triton folder with no GPU in view; they exit 0 (here this Triton's version is
    not the recording's, so they find nothing to compile)."""
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: stand-in\n")
    cache = tmp_path / "cache"
    code = ("import json, sys; from pathlib import Path; "
            "from ttsengine.engine.device.compile import early_kernels as ek; "
            f"ek.NVIDIA_DRIVER = Path({str(driver)!r}); ek.triton_version = lambda: {RECORDED!r}; "
            "from ttsengine import build_kernels_ahead; ws = build_kernels_ahead(); torch = 'torch' in sys.modules; "
            "print(json.dumps({'torch': torch, 'n': len(ws), 'codes': [w.wait(120) for w in ws], "
            "'args': ws[0].args if ws else None}))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TTS_")}
    run = subprocess.run([sys.executable, "-c", code], env={**clean, "TTS_CACHE_DIR": str(cache)},
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["torch"] is False and got["n"] >= 1 and set(got["codes"]) == {0}, (got, run.stderr[-2000:])
    assert got["args"][1:3] == ["-m", "ttsengine.engine.device.compile.early_kernels"]
    # switched off, on the CPU, or without a cache directory: nothing spawned
    for env in ({"TTS_CACHE_DIR": str(cache), "TTS_FEATURES": "-early_kernels"},
                {"TTS_CACHE_DIR": str(cache), "TTS_DEVICE": "cpu"}, {}):
        run = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        assert run.returncode == 0 and json.loads(run.stdout.strip().splitlines()[-1])["n"] == 0, (env, run.stderr)


@pytest.mark.parametrize("argv", [[], ["1"], ["2", "2"], ["x", "3"], ["-1", "3"]])
def test_a_bad_worker_command_line_says_so_in_one_line(argv):
    run = subprocess.run([sys.executable, "-m", "ttsengine.engine.device.compile.early_kernels", *argv],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "usage:" in run.stderr, run.stderr
