"""The codec converted once to its run dtype and kept in the kernel-cache directory (model/loading/codec_cache.py): the
same weights bit for bit as converting the fp32 file, and every damaged entry falls back to the file with one
warning."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN, MODEL_DIR

from ttsengine.config import EngineConfig
from ttsengine.engine.loader import load
from ttsengine.model.loading.checkpoint import _weight_files, load_checkpoint
from ttsengine.model.loading.codec_cache import CodecCache, source_identity

BF16 = torch.bfloat16


@pytest.fixture()
def ckdir(tmp_path) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(MODEL_DIR, d)
    shutil.copy(GOLDEN / "codec_config.json", d)
    return d


@pytest.fixture(scope="module")
def reference():
    """The codec read from the fp32 file and converted, no cache: what every cached load must equal."""
    return load_checkpoint(MODEL_DIR, codec_dtype=BF16).codec.state_dict()


def _load(d: Path, cache: CodecCache):
    ckpt = load_checkpoint(d, codec_dtype=BF16, codec_cache=cache)
    cache.wait()
    return ckpt


def _assert_bit_equal(codec, reference) -> None:
    sd = codec.state_dict()
    assert set(sd) == set(reference)
    for k, v in reference.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k


def _entries(cache: CodecCache) -> list[Path]:
    return sorted(cache.directory.glob("codec-*.pt"))


def test_converted_once_then_read_from_the_cache_bit_equal(ckdir, tmp_path, reference):
    cache = CodecCache(tmp_path / "kc" / "weights")
    first = _load(ckdir, cache)
    assert first.codec_cache == "miss"
    _assert_bit_equal(first.codec, reference)
    [entry] = _entries(cache)
    assert not list(cache.directory.glob("*.tmp")), "the temporary file was renamed into place"
    assert _weight_files(ckdir, cache, BF16)[1] == entry, "the next start reads ahead the entry, not codec.pth"
    second = _load(ckdir, CodecCache(cache.directory))
    assert second.codec_cache == "hit"
    _assert_bit_equal(second.codec, reference)
    assert entry.stat().st_size < (ckdir / "codec.pth").stat().st_size * 0.6  # bf16, without the file's buffers


def test_the_same_file_elsewhere_hits(ckdir, tmp_path):
    cache = CodecCache(tmp_path / "kc")
    _load(ckdir, cache)
    moved = shutil.copytree(ckdir, tmp_path / "elsewhere" / "model")  # new path, new mtime (no copy2 of times)
    assert _load(moved, CodecCache(cache.directory)).codec_cache == "hit"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "values", "wrong key"])
def test_a_damaged_entry_falls_back_to_the_file_with_one_warning(ckdir, tmp_path, reference, caplog, damage):
    cache = CodecCache(tmp_path / "kc")
    _load(ckdir, cache)
    [entry] = _entries(cache)
    if damage == "garbage":
        entry.write_bytes(b"\x00garbage" * 1000)
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    else:  # a well-formed torch file that is not what it says
        obj = torch.load(entry, weights_only=True)
        if damage == "values":
            name = next(iter(obj["state_dict"]))
            obj["state_dict"][name] = torch.zeros_like(obj["state_dict"][name])
        else:
            obj["key"] = "0" * 20
        torch.save(obj, entry)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ttsengine"):
        ckpt = _load(ckdir, CodecCache(cache.directory))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "damaged" in warnings[0].getMessage() and str(entry) in warnings[0].getMessage()
    assert ckpt.codec_cache == "damaged"
    _assert_bit_equal(ckpt.codec, reference)
    # the entry was written again, and the next start reads it without a warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ttsengine"):
        assert _load(ckdir, CodecCache(cache.directory)).codec_cache == "hit"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_another_source_file_misses_and_old_entries_are_pruned(ckdir, tmp_path):
    cache_dir = tmp_path / "kc"
    keys = []
    for i in range(3):  # three different codecs of the same size: only their bytes differ
        sd = torch.load(ckdir / "codec.pth", weights_only=True)
        name = next(k for k, v in sd.items() if v.is_floating_point() and v.dtype == torch.float32)
        sd[name] = sd[name] + i
        torch.save(sd, ckdir / "codec.pth")
        keys.append(source_identity(ckdir / "codec.pth"))
        assert _load(ckdir, CodecCache(cache_dir)).codec_cache == "miss"
    assert len(set(keys)) == 3
    assert len(_entries(CodecCache(cache_dir))) == 2, "the two most recently used entries are kept"
    assert _load(ckdir, CodecCache(cache_dir)).codec_cache == "hit"  # the newest one survived


def test_nothing_cached_when_the_file_already_has_the_run_dtype(ckdir, tmp_path):
    cache = CodecCache(tmp_path / "kc")
    ckpt = load_checkpoint(ckdir, codec_dtype=torch.float32, codec_cache=cache)
    cache.wait()
    assert ckpt.codec_cache == "off" and _entries(cache) == []


def test_an_unwritable_cache_costs_only_a_warning(ckdir, tmp_path, reference, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a directory can't be made under a regular file, even by root
    with caplog.at_level(logging.WARNING, logger="ttsengine"):
        ckpt = _load(ckdir, CodecCache(blocker / "weights"))
    _assert_bit_equal(ckpt.codec, reference)
    assert any("could not write" in r.getMessage() for r in caplog.records)


def test_the_loader_uses_the_kernel_cache_dir_and_the_off_switch(ckdir, tmp_path):
    config = EngineConfig(model_dir=ckdir, device="cpu", codec_dtype="bfloat16", cache_dir=tmp_path / "kc")
    assert load(config, quantize=False).codec_cache == "miss"
    for _ in range(100):  # the loader does not wait for the writer; the next start would find the entry
        if list((tmp_path / "kc" / "weights").glob("codec-*.pt")):
            break
        time.sleep(0.05)
    assert load(config, quantize=False).codec_cache == "hit"
    off = load(config.with_(features="-codec_cache", cache_dir=tmp_path / "kc2"), quantize=False)
    assert off.codec_cache == "off" and not (tmp_path / "kc2").exists()
    assert load(config.with_(cache_dir=None), quantize=False).codec_cache == "off"
    assert load(config.with_(codec_dtype="auto"), quantize=False).codec_cache == "off"  # fp32 on the CPU


def test_source_identity_reads_little_and_sees_a_changed_tensor(ckdir):
    path = ckdir / "codec.pth"
    sd = torch.load(path, weights_only=True)
    torch.save(sd, path)  # as this torch writes it (its zip layout differs between versions)
    before = source_identity(path)
    assert source_identity(path) == before
    k = next(k for k, v in sd.items() if v.dtype == torch.float32 and v.numel() > 4)
    sd[k][2] = sd[k][2] + 1  # one value of one tensor; the file keeps its size
    size = path.stat().st_size
    torch.save(sd, path)
    assert path.stat().st_size == size and source_identity(path) != before
