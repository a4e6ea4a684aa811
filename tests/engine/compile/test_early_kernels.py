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
    n, arch = len(kernel_manifest.ENTRIES), kernel_manifest.TARGET["arch"]
    assert n > 0 and RECORDED and arch  # the manifest is a recording, not a placeholder
    assert early_kernels.processes(32, RECORDED, arch) == min(early_kernels.MAX_PROCESSES, 16, n)
    assert early_kernels.processes(2, RECORDED, arch) == 1  # a small machine: one worker beside the start
    assert early_kernels.processes(32, "0.0.1", arch) == 0  # another Triton: its specializations differ
    assert early_kernels.processes(32, None, arch) == 0  # no Triton
    assert early_kernels.processes(32, RECORDED, arch + 10) == 0  # another GPU: kernels nobody would load
    assert early_kernels.processes(32, RECORDED, None) == 0  # the GPU cannot be told
    assert early_kernels.cache_lacks_kernels(tmp_path)
    group = tmp_path / "triton" / "abc"
    group.mkdir(parents=True)
    assert early_kernels.cache_lacks_kernels(tmp_path)  # an empty folder is no kernel
    (group / "__grp__kernel.json").write_text("{}")
    assert not early_kernels.cache_lacks_kernels(tmp_path)  # the cache has kernels: a restart
    (group / "__grp__kernel.json").unlink()
    (tmp_path / "artifacts-0123.bin").write_bytes(b"blob")
    assert not early_kernels.cache_lacks_kernels(tmp_path)  # the blob brings them


def test_a_start_builds_the_entries_of_its_quantization():
    """Entries are tagged with the quantization of the recording that first compiled them: a bf16 recording's are
    every start's, an int8 recording's only int8 starts'."""
    every = kernel_manifest.ENTRIES
    bf16, int8 = early_kernels.entries(RECORDED, "bf16"), early_kernels.entries(RECORDED, "int8")
    assert {e["quant"] for e in every} == {"bf16", "int8"}
    assert bf16 == tuple(e for e in every if e["quant"] == "bf16") and int8 == every
    assert early_kernels.entries(RECORDED, "none") == bf16 == early_kernels.entries(RECORDED, "int4")
    arch = kernel_manifest.TARGET["arch"]
    assert early_kernels.processes(64, RECORDED, arch, "bf16") == min(early_kernels.MAX_PROCESSES, len(bf16))


def test_workers_count_the_cpus_a_container_may_use(tmp_path):
    quota = tmp_path / "cpu.max"
    mine = early_kernels.cpus(tmp_path / "none")  # no quota file: the affinity
    assert mine >= 1
    quota.write_text("max 100000\n")
    assert early_kernels.cpus(quota) == mine
    quota.write_text("200000 100000\n")  # two CPUs' worth of time
    assert early_kernels.cpus(quota) == min(mine, 2)
    quota.write_text("50000 100000\n")  # half a CPU: still one
    assert early_kernels.cpus(quota) == 1


CHECK = """
import inspect
from ttsengine.engine.device.compile import early_kernels, kernel_manifest
for entry in kernel_manifest.ENTRIES:
    jit = early_kernels.kernel(entry["kernel"])
    names = list(inspect.signature(jit.fn).parameters)
    assert list(entry["signature"]) == names, (entry["kernel"], names)
    module = entry["kernel"].partition(":")[0]
    assert entry["source"] == early_kernels.source_fingerprint(module), (
        f"{module} changed since the manifest was recorded: record it again (docs/speed.md)")
    for index, _ in entry["constants"] + entry["attrs"]:
        assert 0 <= index[0] < len(names), entry["kernel"]
    assert set(entry["options"]) <= {"num_warps", "num_stages", "launch_pdl", "num_ctas", "maxnreg"}, entry
assert "extern_libs" not in kernel_manifest.OPTIONS  # a machine's path: each process keeps its own default
print(len(kernel_manifest.ENTRIES), "entries")
"""


@pytest.mark.skipif(triton_major() < 3, reason="the kernels' factories need Triton 3")
def test_every_manifest_entry_is_still_one_of_our_kernels():
    """An entry whose kernel moved, whose arguments changed, or whose module (or a kernels module it imports) changed
    at all (Triton's cache key holds the source and its starting line) would only cost a worker its time; this catches
    it here, so the manifest is recorded again (scripts/device/triton_census.py --record) with the change. In a fresh
    interpreter without the tests' TRITON_INTERPRET (which makes interpreter functions, not JIT functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and f"{len(kernel_manifest.ENTRIES)} entries" in run.stdout, run.stderr[-3000:]


def test_the_spawn_runs_before_torch_and_its_workers_finish(tmp_path):
    """build_kernels_ahead() from the package root in a fresh interpreter, with the GPU driver's file, this Triton's
    version and the GPU's arch standing in for a GPU machine like the recording's: workers spawned before torch is
    imported, pointed at the cache's Triton folder with no GPU in view; they exit 0 (here this Triton's version is
    not the recording's, so they find nothing to compile)."""
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: stand-in\n")
    cache = tmp_path / "cache"
    code = ("import json, sys; from pathlib import Path; "
            "from ttsengine.engine.device.compile import early_kernels as ek; "
            f"ek.NVIDIA_DRIVER = Path({str(driver)!r}); ek.triton_version = lambda: {RECORDED!r}; "
            f"ek.gpu_arch = lambda: {kernel_manifest.TARGET['arch']!r}; "
            "from ttsengine import build_kernels_ahead; ws = build_kernels_ahead(); torch = 'torch' in sys.modules; "
            "print(json.dumps({'torch': torch, 'n': len(ws), 'codes': [w.wait(120) for w in ws], "
            "'args': ws[0].args if ws else None}))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TTS_")}
    run = subprocess.run([sys.executable, "-c", code], env={**clean, "TTS_CACHE_DIR": str(cache), "TTS_QUANT": "int8"},
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["torch"] is False and got["n"] >= 1 and set(got["codes"]) == {0}, (got, run.stderr[-2000:])
    assert got["args"][1:3] == ["-m", "ttsengine.engine.device.compile.early_kernels"]
    assert got["args"][-1] == "int8" and got["args"][-3:-1] == ["0", str(got["n"])]  # K N QUANT: TTS_QUANT's
    # switched off, on the CPU, or without a cache directory: nothing spawned
    for env in ({"TTS_CACHE_DIR": str(cache), "TTS_FEATURES": "-early_kernels"},
                {"TTS_CACHE_DIR": str(cache), "TTS_DEVICE": "cpu"}, {}):
        run = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        assert run.returncode == 0 and json.loads(run.stdout.strip().splitlines()[-1])["n"] == 0, (env, run.stderr)


@pytest.mark.parametrize("argv", [[], ["1"], ["0", "1"], ["2", "2", "bf16"], ["x", "3", "bf16"], ["-1", "3", "bf16"],
                                  ["0", "1", "bf16", "extra"]])
def test_a_bad_worker_command_line_says_so_in_one_line(argv):
    run = subprocess.run([sys.executable, "-m", "ttsengine.engine.device.compile.early_kernels", *argv],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "usage:" in run.stderr, run.stderr


def test_a_worker_with_nothing_to_build_exits_quietly(tmp_path):
    """Here the installed Triton is not the recording's (or the entries are all built): exit 0, no output."""
    run = subprocess.run([sys.executable, "-m", "ttsengine.engine.device.compile.early_kernels", "0", "1", "bf16"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")})
    assert run.returncode == 0 and run.stdout == "" and run.stderr == "", run.stderr


def test_a_worker_yields_the_cpu_to_the_start():
    """A worker (its main(), here with nothing to build) lowers its own priority by WORKER_NICENESS (capped at the
    lowest, 19): the start's threads beside it come first."""
    code = ("import os, signal; from ttsengine.engine.device.compile import early_kernels as ek; before = os.nice(0); "
            "assert ek.main(['0', '1', 'bf16']) == 0; signal.alarm(0); print(before, os.nice(0))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    before, after = map(int, run.stdout.split())
    assert after == min(19, before + early_kernels.WORKER_NICENESS), run.stderr
