"""Checkpoint loading: every accepted form, and every error listing what is wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import MODEL_DIR
from safetensors.torch import save_file

from ttsengine.errors import CheckpointError
from ttsengine.model.loading.checkpoint import load_checkpoint
from ttsengine.model.loading.weights import read_state_dict
from ttsengine.model.state_dict import fold_weight_norm, fuse_qkv


@pytest.fixture()
def ckdir(tmp_path) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(MODEL_DIR, d)
    shutil.copy(MODEL_DIR.parent / "codec_config.json", d)  # beside codec.pth, the canonical place
    for p in d.iterdir():
        p.chmod(0o644)
    return d


def _model_sd(d: Path) -> dict:
    return torch.load(d / "model.pth", weights_only=True)


def _err(d: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_missing_unexpected_and_misshaped_keys_are_listed(ckdir):
    sd = _model_sd(ckdir)
    del sd["layers.0.attention.wo.weight"]
    sd["layers.0.extra.weight"] = torch.zeros(2)
    sd["norm.weight"] = torch.zeros(65)
    torch.save(sd, ckdir / "model.pth")
    msg = _err(ckdir)
    assert "missing 1: layers.0.attention.wo.weight" in msg
    assert "unexpected 1: layers.0.extra.weight" in msg
    assert "wrong shape 1: norm.weight (file [65], model [64])" in msg
    assert "model.pth" in msg


def test_codec_missing_key_is_listed(ckdir):
    sd = torch.load(ckdir / "codec.pth", weights_only=True)
    del sd["decoder.model.6.conv.bias"]
    torch.save(sd, ckdir / "codec.pth")
    assert "missing 1: decoder.model.6.conv.bias" in _err(ckdir)


def test_truncated_and_corrupt_files(ckdir):
    data = (ckdir / "model.pth").read_bytes()
    (ckdir / "model.pth").write_bytes(data[: len(data) // 2])
    assert "not a readable torch checkpoint (truncated or corrupt?)" in _err(ckdir)
    (ckdir / "model.pth").write_bytes(b"\x00garbage" * 100)
    assert "not a readable torch checkpoint" in _err(ckdir)
    (ckdir / "model.pth").write_bytes(b"")
    assert "model.pth" in _err(ckdir)


def test_pickled_objects_are_refused(ckdir):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    torch.save({"x": Evil()}, ckdir / "model.pth")
    assert "refused to load: it holds objects other than tensors (Unsupported" in _err(ckdir)
    torch.save({"x": Evil()}, ckdir / "model.pth", _use_new_zipfile_serialization=False)
    assert "refused to load" in _err(ckdir)


def test_non_state_dict_is_refused(ckdir):
    torch.save([torch.zeros(1)], ckdir / "model.pth")
    assert "does not hold a state_dict" in _err(ckdir)
    torch.save({}, ckdir / "model.pth")
    assert "state_dict is empty" in _err(ckdir)


def test_missing_files(ckdir):
    (ckdir / "codec.pth").unlink()
    assert "none of codec.pth, codec.safetensors found" in _err(ckdir)
    (ckdir / "tokenizer.tiktoken").unlink()
    assert "required file tokenizer.tiktoken is missing" in _err(ckdir)


def test_corrupt_safetensors(ckdir):
    (ckdir / "model.pth").unlink()
    (ckdir / "model.safetensors").write_bytes(b"{}" * 10)
    assert "not a readable safetensors file" in _err(ckdir)


def test_accepted_forms_give_identical_weights(ckdir):
    ref = load_checkpoint(MODEL_DIR).model.state_dict()
    sd = _model_sd(ckdir)
    torch.save({"state_dict": {"model." + k: v for k, v in sd.items()}}, ckdir / "model.pth")
    got = load_checkpoint(ckdir).model.state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # upstream drops `audio_*` entries
    torch.save({**sd, "audio_projector.weight": torch.zeros(3)}, ckdir / "model.pth")
    load_checkpoint(ckdir)


def test_vocab_and_tokenizer_must_agree(ckdir):
    import json

    raw = json.loads((ckdir / "config.json").read_text())
    raw["vocab_size"] = 300
    (ckdir / "config.json").write_text(json.dumps(raw))
    assert "key 'vocab_size' is 300 but the tokenizer has 347 ids" in _err(ckdir)


def test_weight_norm_forms_agree():
    v = torch.randn(6, 3, 5)
    g = torch.rand(6, 1, 1) + 0.5
    a = fold_weight_norm({"c.weight_g": g, "c.weight_v": v})["c.weight"]
    b = fold_weight_norm({"c.parametrizations.weight.original0": g, "c.parametrizations.weight.original1": v})
    ref = torch._weight_norm(v, g, 0)
    assert torch.allclose(a, ref, atol=1e-6) and torch.equal(a, b["c.weight"])


def test_separate_qkv_is_fused():
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    out = fuse_qkv({"layers.0.attention.wq.weight": q, "layers.0.attention.wk.weight": k,
                    "layers.0.attention.wv.weight": v})
    assert list(out) == ["layers.0.attention.wqkv.weight"]
    assert torch.equal(out["layers.0.attention.wqkv.weight"], torch.cat([q, k, v]))


def test_safetensors_round_trip(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "x.safetensors"))
    assert torch.equal(read_state_dict(tmp_path / "x.safetensors")["a"], torch.ones(2))
