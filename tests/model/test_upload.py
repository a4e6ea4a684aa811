"""Weights to the device through the staged copy (model/loading/upload.py), and the background read-ahead of the files.

The staged path is the one CUDA takes (pinned buffers there); on the CPU it runs the same chunking with plain
buffers, so pieces split across buffers, odd sizes, every dtype and empty tensors are checked here."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine.model.loading.readahead import Readahead
from ttsengine.model.loading.upload import to_device


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "bf16": torch.randn(37, 11, generator=g).to(torch.bfloat16),
        "fp32": torch.randn(5, 3, 7, generator=g),
        "mask": torch.rand(9, 9, generator=g) > 0.5,
        "ids": torch.arange(13, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "view": torch.randn(8, 6, generator=g).t(),  # not contiguous
    }


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
def test_staged_copy_equals_a_plain_one(chunk_bytes):
    sd = _mixed()
    for dtype in (torch.float32, torch.bfloat16):
        plain = to_device(sd, "cpu", lambda t, d=dtype: d, staged=False)
        staged = to_device(sd, "cpu", lambda t, d=dtype: d, staged=True, chunk_bytes=chunk_bytes)
        assert list(staged) == list(sd)
        for k, v in plain.items():
            assert staged[k].dtype == v.dtype and staged[k].shape == v.shape and torch.equal(staged[k], v), k
        assert staged["mask"].dtype == torch.bool and staged["ids"].dtype == torch.int64  # only floats convert


def test_staged_copy_of_a_memory_mapped_file():
    sd = torch.load(str(MODEL_DIR / "model.pth"), weights_only=True, mmap=True, map_location="cpu")
    staged = to_device(sd, "cpu", lambda t: t.dtype, staged=True, chunk_bytes=4096)
    for k, v in sd.items():
        assert torch.equal(staged[k], v), k
    assert all(staged[k].untyped_storage().data_ptr() != v.untyped_storage().data_ptr() for k, v in sd.items())


def test_readahead_reads_and_ignores_what_it_cannot(tmp_path):
    ahead = Readahead([MODEL_DIR / "model.pth", tmp_path / "missing.pth", tmp_path])
    ahead.join(timeout=10)
    assert not any(t.is_alive() for t in ahead.threads)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x01" * (64 << 20))
    ahead = Readahead([big])
    ahead.stop()  # stopping is immediate: the start never waits for it
    ahead.join(timeout=10)
    assert not any(t.is_alive() for t in ahead.threads)
