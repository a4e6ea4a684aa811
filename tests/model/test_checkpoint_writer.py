"""Writing a checkpoint in the real file format (`--write-checkpoint`): the tiny golden checkpoint is the format's
reference (it was written by upstream), so a written one must match it key for key, in order, with the same
shapes and dtypes; then the loader reads it back to exactly the tensors that were written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN, MODEL_DIR

from ttsengine.errors import CheckpointError
from ttsengine.model.loading import synthetic
from ttsengine.model.loading.checkpoint import load_checkpoint
from ttsengine.model.loading.checkpoint_writer import check_target, write_checkpoint, write_random_checkpoint
from ttsengine.model.loading.codec_file_layout import to_file_layout, weight_norm_form
from ttsengine.model.state_dict import fold_weight_norm
from ttsengine.model.tokenizer import read_special_tokens, read_tiktoken_ranks


@pytest.fixture()
def tiny_preset(monkeypatch):
    """A random-weights preset with the tiny golden shapes (what `--random-weights tiny` would be)."""
    spec = synthetic.PresetSpec(json.loads((MODEL_DIR / "config.json").read_text()),
                                json.loads((GOLDEN / "codec_config.json").read_text()), base_vocab=300)
    monkeypatch.setitem(synthetic.FAMILIES, "tiny", spec)
    return "tiny"


def _file(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _same_layout(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert (a[k].shape, a[k].dtype) == (b[k].shape, b[k].dtype), k


def test_golden_checkpoint_rewritten_is_the_golden_files(tmp_path):
    golden = load_checkpoint(MODEL_DIR)
    ranks, specials = read_tiktoken_ranks(MODEL_DIR / "tokenizer.tiktoken"), read_special_tokens(
        MODEL_DIR / "special_tokens.json")
    sd = {k: v.to(torch.bfloat16) for k, v in golden.model.state_dict().items()}
    d = write_checkpoint(tmp_path / "ck", json.loads((MODEL_DIR / "config.json").read_text()), ranks, specials, sd,
                         golden.codec, json.loads((GOLDEN / "codec_config.json").read_text()))
    _same_layout(_file(d / "model.pth"), _file(MODEL_DIR / "model.pth"))
    _same_layout(_file(d / "codec.pth"), _file(MODEL_DIR / "codec.pth"))
    for name in ("tokenizer.tiktoken", "special_tokens.json"):
        assert (d / name).read_bytes() == (MODEL_DIR / name).read_bytes(), name
    assert json.loads((d / "config.json").read_text()) == json.loads((MODEL_DIR / "config.json").read_text())
    # the persistent buffers carry upstream's values, and the model files hold the golden tensors
    written, real = _file(d / "codec.pth"), _file(MODEL_DIR / "codec.pth")
    for k in (k for k in real if k.endswith((".freqs_cis", ".causal_mask"))):
        assert torch.equal(written[k], real[k]), k
    back = load_checkpoint(d)
    for k, v in golden.model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v.to(torch.bfloat16).float()), k
    for k, v in golden.codec.state_dict().items():
        torch.testing.assert_close(back.codec.state_dict()[k], v, rtol=1e-6, atol=1e-7)


def test_weight_norm_pairs_fold_back_to_the_weights():
    codec = load_checkpoint(MODEL_DIR).codec
    layout = to_file_layout(codec)
    normed = [k for k in codec.state_dict() if weight_norm_form(k)]
    assert len(normed) == 68 and not any(k in layout for k in normed)
    folded = fold_weight_norm({k: v for k, v in layout.items() if not k.endswith((".freqs_cis", ".causal_mask"))})
    assert set(folded) == set(codec.state_dict())
    for k, v in codec.state_dict().items():
        torch.testing.assert_close(folded[k], v, rtol=1e-6, atol=1e-7)


def test_random_checkpoint_written_then_loaded_is_the_same_tensors(tmp_path, tiny_preset):
    d = write_random_checkpoint(tiny_preset, tmp_path / "new" / "ck", seed=3)
    assert sorted(p.name for p in d.iterdir()) == ["codec.pth", "codec_config.json", "config.json", "model.pth",
                                                   "special_tokens.json", "tokenizer.tiktoken"]
    assert not [p for p in d.parent.iterdir() if p != d], "the temporary directory is gone"
    assert all(v.dtype == torch.bfloat16 for v in _file(d / "model.pth").values())
    ref = synthetic.random_checkpoint(tiny_preset, "cpu", torch.bfloat16, torch.float32, seed=3)
    back = load_checkpoint(d, dtype=torch.bfloat16)
    for k, v in ref.model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k
    for k, v in ref.codec.state_dict().items():
        torch.testing.assert_close(back.codec.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    assert back.tokenizer.n_vocab == ref.tokenizer.n_vocab
    assert back.tokenizer.encode("hello there") == ref.tokenizer.encode("hello there")


def test_target_must_be_new_or_empty_and_writable(tmp_path, tiny_preset):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty") as e:
        write_random_checkpoint(tiny_preset, full)
    assert "\n" not in str(e.value) and (full / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        check_target(a_file)
    with pytest.raises(CheckpointError, match="cannot write there"):
        check_target(a_file / "sub" / "ck")  # a regular file in the path (refused even for root)
    with pytest.raises(CheckpointError, match=r"needs .* GB, .* GB free"):
        check_target(tmp_path / "big", need_bytes=shutil.disk_usage(tmp_path).free * 2)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_random_checkpoint(tiny_preset, empty) == empty.absolute()


def test_interrupted_write_leaves_nothing(tmp_path, tiny_preset, monkeypatch):
    import ttsengine.model.loading.checkpoint_writer as writer

    def fail(path, sd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_save", fail)
    with pytest.raises(OSError):
        write_random_checkpoint(tiny_preset, tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []
