"""Each branch of compat.py: the installed torch/torchao takes one, fakes take the others."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from ttsengine import compat


def test_torch_version_parses():
    major, minor = compat.torch_version()
    assert major == int(torch.__version__.split(".")[0]) and minor >= 0


def test_inductor_options_only_set_existing_keys():
    import torch._inductor.config as inductor

    old = inductor.fx_graph_cache
    try:
        applied = compat.set_inductor_options(fx_graph_cache=True, no_such_key_anywhere=1,
                                              **{"triton.unique_kernel_names": True, "nope.deeper": 1})
        assert applied.get("fx_graph_cache") is True and "no_such_key_anywhere" not in applied
        assert "nope.deeper" not in applied
    finally:
        inductor.fx_graph_cache = old


def test_cache_artifacts_are_safe_everywhere(monkeypatch):
    monkeypatch.setattr(torch, "compiler", types.SimpleNamespace())  # a torch without the API
    assert compat.cache_artifacts_supported() is False
    assert compat.save_cache_artifacts() is None and compat.load_cache_artifacts(b"x") is False


def test_compile_gate_follows_version(monkeypatch):
    monkeypatch.setattr(compat, "torch_version", lambda: (2, 2))
    assert compat.compile_supported() is False
    monkeypatch.setattr(compat, "torch_version", lambda: (2, 11))
    assert compat.compile_supported() is compat.custom_ops_available()


def _fake_torchao(monkeypatch, version: str, **api):
    calls = []
    q = types.SimpleNamespace(**{k: (lambda *a, _k=k, **kw: calls.append(_k) or _k) for k in api})
    if "quantize_" in api:
        q.quantize_ = lambda model, cfg, filter_fn=None: calls.append(("quantize_", cfg))
    pkg = types.ModuleType("torchao")
    pkg.__version__ = version
    pkg.quantization = q
    monkeypatch.setitem(sys.modules, "torchao", pkg)
    monkeypatch.setitem(sys.modules, "torchao.quantization", q)
    return calls


@pytest.mark.parametrize("version, api, torch_v, expect", [
    ("0.18.0", {"quantize_": 1, "Int8WeightOnlyConfig": 1, "int8_weight_only": 1}, (2, 11), "Int8WeightOnlyConfig"),
    ("0.9.0", {"quantize_": 1, "Int8WeightOnlyConfig": 1, "int8_weight_only": 1}, (2, 2), "int8_weight_only()"),
    ("0.5.0", {"quantize_": 1, "int8_weight_only": 1}, (2, 4), "int8_weight_only()"),
    ("0.2.0", {"change_linear_weights_to_int8_woqtensors": 1}, (2, 2), "change_linear_weights_to_int8_woqtensors"),
    ("0.1.0", {}, (2, 2), None),
])
def test_torchao_api_branches(monkeypatch, version, api, torch_v, expect):
    _fake_torchao(monkeypatch, version, **api)
    monkeypatch.setattr(compat, "torch_version", lambda: torch_v)
    used = compat.torchao_quantize(torch.nn.Linear(16, 16), "int8", lambda m, fqn="": True)
    assert (used is None and expect is None) or expect in used


def test_no_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    assert compat.torchao_version() is None
    assert compat.torchao_quantize(torch.nn.Linear(16, 16), "int8", lambda m, fqn="": True) is None


def test_load_accepts_paths_and_mmaps(tmp_path):
    torch.save({"a": torch.ones(3)}, tmp_path / "x.pth")
    assert torch.equal(compat.load_torch_file(tmp_path / "x.pth")["a"], torch.ones(3))
    torch.save({"a": torch.ones(3)}, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    assert torch.equal(compat.load_torch_file(tmp_path / "old.pth")["a"], torch.ones(3))  # no mmap for the old format


def test_int4_packing_falls_back_to_tinygemm_without_mslk(monkeypatch):
    import dataclasses
    import importlib.util

    @dataclasses.dataclass
    class New:  # torchao >= 0.14: a packing-format field, default "plain" needs mslk
        group_size: int = 128
        int4_packing_format: str = "plain"

    @dataclasses.dataclass
    class Old:
        group_size: int = 128

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mslk" else real(name, *a))
    assert compat._int4_packing(New) == "tile_packed_to_4d"
    assert compat._int4_packing(Old) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "mslk" else real(name, *a))
    assert compat._int4_packing(New) is None  # mslk installed: torchao's default
