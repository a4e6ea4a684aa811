"""`python -m ttsengine info`: sizes of a checkpoint without loading its weights, checked against
numbers computed here another way (spec counts, the files' own tensors, quant.py on meta modules)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import MODEL_DIR, complete_model, run_cli
from safetensors.torch import save_file

from ttsengine.errors import CheckpointError
from ttsengine.model.loading.checkpoint import load_checkpoint
from ttsengine.model.quant import quantize, weight_bytes
from ttsengine.tools import info

GIB = 1 << 30
S1_DUAL_AR, S1_CODEC = 860_169_216, 391_398_385  # tests/model/test_synthetic.py says where from


def _json(*args: str) -> dict:
    proc = run_cli("ttsengine", "info", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1
    return json.loads(proc.stdout)


def test_json_for_random_s1_mini():
    r = _json("--random-weights", "s1-mini", "--memory-gb", "24")
    assert r["dual_ar_params"] == S1_DUAL_AR and r["codec_params"] == S1_CODEC
    parts = r["parts"]
    assert sum(parts[p]["params"] for p in info.PARTS[:-1]) == S1_DUAL_AR
    assert parts["slow_transformer"]["params"] == 28 * 15_730_944 + 1024  # layers + final norm (spec §2)
    assert parts["embeddings"]["params"] == (155_776 + 40_960 + 4096) * 1024
    assert parts["output_head"]["params"] == (155_776 + 4096) * 1024
    assert r["weight_bytes"] == 2 * (S1_DUAL_AR + S1_CODEC)  # bf16, nothing quantized
    kv = 28 * 2 * 8 * 128 * 2  # layers, K and V, KV heads, head_dim, bf16
    assert r["kv_bytes_per_position"] == kv
    assert r["frame_rate_hz"] == 44100 / 2048 and r["max_seq_len"] == 8192
    assert r["kv_bytes_per_stream_minute"] == round(kv * 44100 / 2048 * 60)
    assert r["kv_positions_fit"] == (24 * GIB - 2 * (S1_DUAL_AR + S1_CODEC)) // kv == 202_869
    assert r["full_context_streams_fit"] == 202_869 // 8192
    assert r["config"]["fast"]["head_dim"] == 64 and r["config"]["scale_codebook_embeddings"] is True
    assert r["tokenizer"]["semantic_begin_id"] == 151_658 and r["files"] == {}


def test_json_for_the_golden_checkpoint_matches_its_files():
    r = _json("--model", str(MODEL_DIR), "--memory-gb", "0.01", "--dtype", "float32")
    model_sd = torch.load(MODEL_DIR / "model.pth", weights_only=True)
    assert r["dual_ar_params"] == sum(t.numel() for t in model_sd.values())
    assert r["files"]["model"]["stored_dtypes"] == {str(next(iter(model_sd.values())).dtype)[6:]: r["dual_ar_params"]}
    ck = load_checkpoint(MODEL_DIR)  # the real load, for the codec (weight norm folded) and the config
    assert r["codec_params"] == sum(p.numel() for p in ck.codec.parameters())
    assert r["weight_bytes"] == 4 * (r["dual_ar_params"] + r["codec_params"])
    s = ck.config.slow
    kv = s.n_layer * 2 * s.n_local_heads * s.head_dim * 4
    assert r["kv_bytes_per_position"] == kv
    assert r["kv_positions_fit"] == (int(0.01 * GIB) - r["weight_bytes"]) // kv > 0


def test_human_output_is_a_table():
    proc = run_cli("ttsengine", "info", "--model", str(MODEL_DIR), "--quant", "int8", "--memory-gb", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for row in ("slow transformer", "fast transformer", "embeddings", "output head", "DualAR total", "codec",
                "frame rate      21.53 frames/s", "max context     4096 positions", "KV cache", "in 1 GiB"):
        assert row in out, row
    assert "quantization int8" in out and "model file:" in out and "{" not in out


def test_bad_model_dir_is_one_line(tmp_path):
    proc = run_cli("ttsengine", "info", "--model", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"ttsengine info: {tmp_path / 'nope'}: model directory not found"]


def test_inconsistent_files_fail_like_loading(tmp_path):
    root = complete_model(tmp_path / "ck")
    sd = torch.load(root / "model.pth", weights_only=True)
    good = sd["layers.0.attention.wo.weight"]
    sd["layers.0.attention.wo.weight"] = torch.zeros(3, 3)
    torch.save(sd, root / "model.pth")
    with pytest.raises(CheckpointError) as loading:
        load_checkpoint(root)
    with pytest.raises(CheckpointError) as described:
        info.from_model_dir(root)
    assert str(described.value) == str(loading.value) and "wrong shape 1" in str(loading.value)
    sd["layers.0.attention.wo.weight"] = good
    torch.save(sd, root / "model.pth")
    (root / "codec.pth").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="codec.pth: not a readable torch checkpoint"):
        info.from_model_dir(root)


def test_safetensors_shapes_come_from_the_header(tmp_path):
    root = complete_model(tmp_path / "ck")
    sd = torch.load(root / "model.pth", weights_only=True)
    (root / "model.pth").unlink()
    save_file({"model." + k: v.contiguous() for k, v in sd.items()}, str(root / "model.safetensors"))
    shapes = info.read_shapes(root / "model.safetensors")
    assert {k: (tuple(v.shape), v.dtype, v.device.type) for k, v in shapes.items()} == {
        "model." + k: (tuple(v.shape), v.dtype, "meta") for k, v in sd.items()}
    assert info.report(info.from_model_dir(root))["parts"] == info.report(info.from_model_dir(MODEL_DIR))["parts"]
    data = (root / "model.safetensors").read_bytes()
    (root / "model.safetensors").write_bytes(data[:-16])
    with pytest.raises(CheckpointError, match="not a readable safetensors file .* tensor data ends at byte"):
        info.from_model_dir(root)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_int8_bytes_are_what_quant_py_stores(dtype):
    """The int8 count against the engine's own Int8Linear, applied to the meta modules."""
    r = info.report(info.from_preset("s1-mini"), dtype, "int8")
    d = info.from_preset("s1-mini")
    got = []
    for module in (d.dual_ar, d.codec):
        module.to(info.DTYPES[dtype])
        quantize(module, "int8", "dequant")
        got.append(weight_bytes(module))
    assert [r["dual_ar_bytes"], r["codec_bytes"]] == got


def test_int4_counts_half_bytes_and_group_scales():
    assert info.linear_weight_bytes(3072, 1024, "int4", 2) == 3072 * 1024 // 2 + 3072 * (1024 // 128) * 4
    assert info.linear_weight_bytes(3072, 1024, "int8", 2) == 3072 * 1024 + 3072 * 4
    assert info.linear_weight_bytes(3072, 1024, "none", 2) == 3072 * 1024 * 2
    r4 = info.report(info.from_preset("s1-mini"), "bfloat16", "int4")
    assert r4["parts"]["embeddings"]["bytes"] == 2 * r4["parts"]["embeddings"]["params"]  # embeddings stay
    assert r4["parts"]["output_head"]["bytes"] == (155_776 + 4096) * (1024 // 2 + 8 * 4)
