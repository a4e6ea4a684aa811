"""The kernel cache: directory set-up, mismatch detection, blob round trip, and the warm command."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from conftest import MODEL_DIR, run_cli

from ttsengine import compat
from ttsengine.engine.device.compile.kernel_cache import KernelCache, environment, relink_triton_groups


def test_fresh_directory_is_a_miss_then_dir(tmp_path):
    kc = KernelCache(tmp_path / "cache", {"model": "tiny"})
    assert kc.setup() == "miss"
    kc.save_metadata()
    assert KernelCache(tmp_path / "cache", {"model": "tiny"}).setup() == "dir"


def test_cache_from_elsewhere_is_detected_and_logged_once(tmp_path, caplog):
    d = tmp_path / "cache"
    d.mkdir()
    other = {**environment(), "gpu": "NVIDIA A10G", "torch": "2.2.2"}
    (d / "cache-meta.json").write_text(json.dumps({"key": "0123456789abcdef", "environment": other}))
    with caplog.at_level(logging.WARNING):
        assert KernelCache(d, {"model": "tiny"}).setup() == "mismatch"
    lines = [r.message for r in caplog.records if "kernel cache" in r.message]
    assert len(lines) == 1 and "NVIDIA A10G" in lines[0] and "recompiling" in lines[0]


def test_cache_for_other_settings_names_the_setting(tmp_path, caplog):
    # same machine, other engine settings: the line says which setting, not "built for X; this is X"
    d = tmp_path / "cache"
    KernelCache(d, {"model": "tiny", "fused": ["layer_gemv"]}).save_metadata()
    with caplog.at_level(logging.WARNING):
        assert KernelCache(d, {"model": "tiny", "fused": ["layer_gemv", "pdl"]}).setup() == "mismatch"
    lines = [r.getMessage() for r in caplog.records if "kernel cache" in r.getMessage()]
    assert len(lines) == 1 and "other settings: fused ['layer_gemv'] (now ['layer_gemv', 'pdl'])" in lines[0]


def test_corrupt_blob_only_costs_a_recompile(tmp_path, caplog):
    kc = KernelCache(tmp_path, {"model": "tiny"})
    tmp_path.mkdir(exist_ok=True)
    kc.blob_path.write_bytes(b"not a cache blob")
    with caplog.at_level(logging.WARNING):
        status = kc.setup()
    assert status in ("miss", "dir") if compat.cache_artifacts_supported() else status == "miss"


@pytest.mark.skipif(not compat.cache_artifacts_supported(), reason="torch < 2.7 has no portable cache blob")
def test_blob_round_trip_with_a_real_compile(tmp_path):
    kc = KernelCache(tmp_path / "a", {"model": "tiny"})
    kc.setup()
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    f(torch.randn(8))
    blob = kc.save()
    assert blob is not None and blob.stat().st_size > 0
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / blob.name).write_bytes(blob.read_bytes())  # the blob alone, into an empty directory
    assert KernelCache(fresh, {"model": "tiny"}).setup() == "blob"


@pytest.mark.skipif(not compat.cache_artifacts_supported(), reason="torch < 2.7 has no portable cache blob")
def test_a_blobs_compile_artifacts_wait_for_the_first_compile(tmp_path):
    """A start from a blob (feature lazy_compiler): setup writes its files but leaves torch's compile artifacts, whose
    load imports torch._dynamo (~1 s), to the first compile; compat.compiler() then loads them. A fresh process, so
    nothing else has imported the compiler."""
    kc = KernelCache(tmp_path / "a", {"model": "tiny"})
    kc.setup()
    torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.randn(8))
    blob = kc.save()
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / blob.name).write_bytes(blob.read_bytes())
    code = """
import sys
from pathlib import Path
from ttsengine.engine.device.compile.kernel_cache import ARTIFACTS
from unittest import mock
from ttsengine import compat
from ttsengine.engine.device.compile.kernel_cache import KernelCache
kc = KernelCache(Path(sys.argv[1]), {"model": "tiny"})
with mock.patch.object(compat, "load_cache_artifacts", wraps=compat.load_cache_artifacts) as load:
    print(kc.setup(), "torch._dynamo" in sys.modules, load.call_count)
    compat.compiler()
    import zipfile
    with zipfile.ZipFile(kc.blob_path) as z:
        artifacts = z.read(ARTIFACTS)
    print(load.call_count, load.call_args.args[0] == artifacts)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code, str(fresh)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["blob", "False", "0", "1", "True"], out.stdout + out.stderr


def test_blob_carries_the_triton_cache_into_an_empty_directory(tmp_path):
    # our own Triton kernels (paged attention, Snake, int8) live only in the Triton cache directory
    kc = KernelCache(tmp_path / "a", {"model": "tiny"})
    kc.setup()
    kernel = tmp_path / "a" / "triton" / "ABC123" / "snake.cubin"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"\x7fELF kernel bytes")
    (kernel.parent / "snake.lock").write_bytes(b"")  # lock files stay behind
    # a kernel another process is writing (Triton's temp folder, renamed into place when whole) stays behind too
    half = tmp_path / "a" / "triton" / "ABC123" / "tmp.pid_77_1234" / "snake.cubin"
    half.parent.mkdir(parents=True)
    half.write_bytes(b"\x7fELF half")
    blob = kc.save()
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / blob.name).write_bytes(blob.read_bytes())
    assert KernelCache(fresh, {"model": "tiny"}).setup() == "blob"
    assert (fresh / "triton" / "ABC123" / "snake.cubin").read_bytes() == b"\x7fELF kernel bytes"
    assert not (fresh / "triton" / "ABC123" / "snake.lock").exists()
    assert not (fresh / "triton" / "ABC123" / "tmp.pid_77_1234").exists()


def test_the_blob_carries_the_precompiled_units(tmp_path):
    kc = KernelCache(tmp_path / "a", {"model": "tiny"})
    kc.setup()
    kc.precompiled_dir.mkdir(parents=True)
    (kc.precompiled_dir / "slow_layer.0.pt2").write_bytes(b"trace bytes")
    blob = kc.save()
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / blob.name).write_bytes(blob.read_bytes())
    kc2 = KernelCache(fresh, {"model": "tiny"})
    assert kc2.setup() == "blob"
    assert (kc2.precompiled_dir / "slow_layer.0.pt2").read_bytes() == b"trace bytes"
    assert kc2.precompiled_dir.name == kc.precompiled_dir.name == f"precompiled-{kc.key}"


def _triton_kernel(root, key, name):
    """A compiled kernel as Triton's file cache lays it out: its files, and a group file listing them by path."""
    d = root / "triton" / key
    d.mkdir(parents=True)
    files = {f"{name}.{ext}": d / f"{name}.{ext}" for ext in ("cubin", "json")}
    for path in files.values():
        path.write_bytes(b"kernel bytes")
    (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {n: str(p) for n, p in files.items()}}))
    return d / f"__grp__{name}.json"


def _children(group):
    return json.loads(group.read_text())["child_paths"]


def test_a_moved_cache_keeps_its_triton_kernels(tmp_path):
    # Triton takes a group whose listed paths are missing for a miss; a cache moved (or unpacked from the blob)
    # elsewhere must point them here, or every Triton kernel compiles again at each start
    _triton_kernel(tmp_path / "made", "K1", "snake")
    (tmp_path / "made").rename(tmp_path / "served")
    group = tmp_path / "served" / "triton" / "K1" / "__grp__snake.json"
    assert not any(Path(p).exists() for p in _children(group).values())  # what Triton would see: a miss
    KernelCache(tmp_path / "served", {"model": "tiny"}).setup()
    assert _children(group) == {"snake.cubin": str(group.parent / "snake.cubin"),
                                "snake.json": str(group.parent / "snake.json")}
    assert relink_triton_groups(tmp_path / "served" / "triton") == 0  # in place now: nothing to rewrite


def test_relink_leaves_sound_and_truly_missing_kernels(tmp_path):
    sound = _triton_kernel(tmp_path, "K1", "int8")
    before = sound.read_text()
    lost = _triton_kernel(tmp_path, "K2", "paged")
    for p in _children(lost).values():
        Path(p).unlink()  # its files are gone everywhere: Triton must compile it again
    lost_before = lost.read_text()
    (tmp_path / "triton" / "K3").mkdir()
    (tmp_path / "triton" / "K3" / "__grp__junk.json").write_text("{not json")
    assert relink_triton_groups(tmp_path / "triton") == 0
    assert sound.read_text() == before and lost.read_text() == lost_before
    assert relink_triton_groups(tmp_path / "absent") == 0


def test_relink_on_a_read_only_cache_is_no_error(tmp_path, monkeypatch):
    # a cache baked into an image or mounted read-only: the rewrite fails (EROFS, also for the cleanup's unlink of a
    # file never made), the start goes on and Triton compiles those kernels as before
    import errno

    from ttsengine.engine.device.compile import kernel_cache

    _triton_kernel(tmp_path / "made", "K1", "snake")
    (tmp_path / "made").rename(tmp_path / "served")
    group = tmp_path / "served" / "triton" / "K1" / "__grp__snake.json"
    before = group.read_text()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(kernel_cache.Path, "write_bytes", read_only)
    monkeypatch.setattr(kernel_cache.Path, "unlink", read_only)
    assert relink_triton_groups(tmp_path / "served" / "triton") == 0
    assert group.read_text() == before


def test_blob_members_are_written_whole(tmp_path, monkeypatch):
    # unpacking writes each member aside and renames it: a start killed mid-write leaves no torn kernel file that a
    # relinked group would then point Triton at
    from ttsengine.engine.device.compile import kernel_cache

    kc = KernelCache(tmp_path / "a", {"model": "tiny"})
    kc.setup()
    _triton_kernel(tmp_path / "a", "K1", "snake")
    blob = kc.save()
    fresh = tmp_path / "b"
    fresh.mkdir()
    (fresh / blob.name).write_bytes(blob.read_bytes())
    real_replace, renamed = kernel_cache.os.replace, []
    monkeypatch.setattr(kernel_cache.os, "replace", lambda a, b: (renamed.append(Path(b).name), real_replace(a, b)))
    assert KernelCache(fresh, {"model": "tiny"}).setup() == "blob"
    assert {"snake.cubin", "snake.json", "__grp__snake.json"} <= set(renamed)
    assert not [p for p in fresh.rglob("*.tmp")]
    assert (fresh / "triton" / "K1" / "snake.cubin").read_bytes() == b"kernel bytes"


@pytest.mark.gpu
def test_a_moved_triton_cache_compiles_nothing_again(tmp_path):
    # a real Triton kernel compiled in one process, its cache moved, a second process: without the relink Triton
    # compiles it again (rewrites the kernel's files), with it the moved files are loaded as they are
    script = ("import sys, torch; from pathlib import Path; from ttsengine.engine.device.compile.kernel_cache import "
              "relink_triton_groups; from ttsengine.model.kernels.codec.snake import snake_triton\n"
              "if sys.argv[1] == '1': relink_triton_groups(Path(sys.argv[2]))\n"
              "x = torch.randn(2, 8, 64, device='cuda'); snake_triton(x, torch.ones(8, device='cuda'))\n"
              "torch.cuda.synchronize()")

    def compiled(cache, relink):
        """Runs the kernel with `cache` as Triton's cache -> the kernel files written (not group files)."""
        import subprocess
        import sys

        old = 1_000_000_000  # 2001: any file written by the run is newer
        for p in cache.rglob("*") if cache.exists() else ():
            os.utime(p, (old, old))
        proc = subprocess.run([sys.executable, "-c", script, relink, str(cache)], capture_output=True, text=True,
                              env={**os.environ, "TRITON_CACHE_DIR": str(cache)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {p.name for p in cache.rglob("*") if p.is_file() and not p.name.startswith("__grp__")
                and p.stat().st_mtime > old + 1}

    assert compiled(tmp_path / "a", "0")  # the first run compiles
    (tmp_path / "a").rename(tmp_path / "b")
    assert compiled(tmp_path / "b", "1") == set()  # relinked: loaded, nothing compiled
    (tmp_path / "b").rename(tmp_path / "c")
    assert compiled(tmp_path / "c", "0")  # the control: not relinked, Triton compiles it again


def test_blob_members_outside_the_directory_are_refused(tmp_path, caplog):
    import zipfile

    d = tmp_path / "cache"
    kc = KernelCache(d, {"model": "tiny"})
    d.mkdir()
    with zipfile.ZipFile(kc.blob_path, "w") as z:
        z.writestr("../escaped.txt", "x")
    with caplog.at_level(logging.WARNING):
        assert kc.setup() == "miss"
    assert not (tmp_path / "escaped.txt").exists()
    assert any("outside the cache directory" in r.message for r in caplog.records)


@pytest.mark.parametrize("features", ["auto", "-lazy_compiler"])
def test_warm_command_reports_json(tmp_path, features):
    """Its JSON line, the load's phases and whether torch's compiler was imported by the first audio: with
    lazy_compiler (the default) nothing on the way there imports it (our custom ops' eager calls included); off, the
    load does, in a phase of its own."""
    proc = run_cli("ttsengine", "warm", "--model", str(MODEL_DIR), "--cache-dir", str(tmp_path / "kc"),
                   env={"TTS_DEVICE": "cpu", "TTS_FEATURES": features})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["process_to_first_audio_s"] > report["load_s"] > 0
    phases = report["load_phases"]  # the load's parts: they add up to (almost) all of it
    lazy = features == "auto"
    assert set(phases) == {"files", "model", "codec"} | (set() if lazy else {"compiler"})
    assert all(s >= 0 for s in phases.values()) and 0 < sum(phases.values()) <= report["load_s"] + 0.01
    assert report["compiler_at_first_audio"] is not lazy
    assert report["quantization"] == "bf16 (none)" and report["compiled"] is False


def test_warm_without_cache_dir_is_one_line():
    proc = run_cli("ttsengine", "warm", "--model", str(MODEL_DIR), env={"TTS_CACHE_DIR": ""})
    assert proc.returncode == 2 and "TTS_CACHE_DIR" in proc.stderr and "Traceback" not in proc.stderr


def test_the_engines_cache_key_holds_the_layer_gemv_rows():
    # which buckets run compiled units (the rest run layer_gemv's kernels) is part of what a cache holds: a cache built
    # with one TTS_LAYER_GEMV_ROWS is reported as built for other settings under another
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig
    from ttsengine.engine.loader import load

    ckpt = load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))
    keys = {}
    for fused in ("+layer_gemv", "-kernels"):
        for rows in (8, 16):
            eng = Engine(ckpt, EngineConfig(model_dir=MODEL_DIR, device="cpu", features=fused, layer_gemv_rows=rows))
            try:
                assert eng.kernel_cache.describe["layer_gemv_rows"] == (rows if fused != "-kernels" else 0)
                keys[fused, rows] = eng.kernel_cache.key
            finally:
                eng.close()
    assert keys["+layer_gemv", 8] != keys["+layer_gemv", 16]
    assert keys["-kernels", 8] == keys["-kernels", 16]  # without layer_gemv the rows change nothing compiled
