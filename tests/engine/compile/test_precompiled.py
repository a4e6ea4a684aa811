"""Precompiled decode-step units (engine/device/compile/precompiled.py): trace + save once, load in a fresh process
without tracing, one variant per shape family, and every failure costs only speed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from ttsengine import compat

pytestmark = pytest.mark.skipif(not compat.precompile_supported(),
                                reason="torch's AOT precompile needs torch >= 2.10")

# A unit shaped like the slow layer: a module argument, a closure over a custom op (an OpOverload,
# which only external_data can carry), a batch dim marked dynamic.
UNIT = textwrap.dedent('''
    import torch
    from torch import nn

    @torch.library.custom_op("ttsengine_test::scaled_add", mutates_args=())
    def scaled_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        return x + scale * y

    scaled_add.register_fake(lambda x, y, scale: torch.empty_like(x))
    OP = torch.ops.ttsengine_test.scaled_add.default

    def make_unit(op, scale):
        def unit(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return op(torch.relu(layer(x)), bias, scale).sum(-1, keepdim=True) * 2
        return unit

    def layer():
        torch.manual_seed(0)
        return nn.Linear(16, 16)

    def eager():
        return make_unit(OP, 0.5)

    def args(batch, width=16):
        g = torch.Generator().manual_seed(batch * 100 + width)
        return layer(), torch.randn(batch, width, generator=g), torch.randn(batch, 16, generator=g)

    def precompiled(store, op=None):
        from ttsengine.engine.device.compile.precompiled import Precompiled

        fn = make_unit(OP if op is None else op, 0.5)
        return Precompiled(fn, "unit", (1, 2), 16, store, lambda: torch.compile(fn))
''')


@pytest.fixture(scope="module")
def unit_module(tmp_path_factory):
    d = tmp_path_factory.mktemp("unitmod")
    (d / "precomp_unit.py").write_text(UNIT)
    sys.path.insert(0, str(d))
    try:
        import precomp_unit

        yield d, precomp_unit
    finally:
        sys.path.remove(str(d))


def test_trace_once_then_reuse_then_load_in_a_fresh_process(unit_module, tmp_path):
    d, mod = unit_module
    store = tmp_path / "pre"
    unit = mod.precompiled(store)
    eager = mod.eager()
    with torch.inference_mode():
        for batch in (2, 5, 9):  # one variant serves every batch in [2, 16]
            a = mod.args(batch)
            torch.testing.assert_close(unit(*a), eager(*a))
    assert (unit.compiled, unit.loaded) == (1, 0) and [p.name for p in store.iterdir()] == ["unit.0.pt2"]

    code = textwrap.dedent(f'''
        import json, sys, torch
        sys.path[:0] = [{str(d)!r}]
        import precomp_unit as mod
        from pathlib import Path
        from torch._dynamo.utils import counters
        unit, out = mod.precompiled(Path({str(store)!r})), []
        with torch.inference_mode():
            for batch in (3, 7):
                a = mod.args(batch)
                out.append([unit(*a).tolist(), mod.eager()(*a).tolist()])
        print(json.dumps({{"out": out, "loaded": unit.loaded, "compiled": unit.compiled,
                          "frames_traced": sum(counters["frames"].values()),
                          "plain": unit._fallback is not None}}))
    ''')
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert (report["loaded"], report["compiled"], report["plain"]) == (1, 0, False)
    assert report["frames_traced"] == 0  # Dynamo traced nothing: the saved trace ran
    for got, want in report["out"]:
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_a_new_shape_family_becomes_a_second_variant(unit_module, tmp_path):
    _, mod = unit_module
    store = tmp_path / "pre"
    unit = mod.precompiled(store)
    eager = mod.eager()
    with torch.inference_mode():
        a = mod.args(4)
        unit(*a)
        wide = (nn.Linear(32, 16), *mod.args(4, width=32)[1:])  # another input width: guards reject variant 0
        torch.testing.assert_close(unit(*wide), eager(*wide))
    assert unit.compiled == 2 and sorted(p.name for p in store.iterdir()) == ["unit.0.pt2", "unit.1.pt2"]
    again = mod.precompiled(store)
    with torch.inference_mode():
        torch.testing.assert_close(again(*wide), eager(*wide))
        torch.testing.assert_close(again(*a), eager(*a))
    assert (again.loaded, again.compiled) == (2, 0)


def test_a_torn_file_is_logged_and_traced_again(unit_module, tmp_path, caplog):
    _, mod = unit_module
    store = tmp_path / "pre"
    store.mkdir()
    (store / "unit.0.pt2").write_bytes(b"half a pickle")
    unit = mod.precompiled(store)
    a = mod.args(3)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        torch.testing.assert_close(unit(*a), mod.eager()(*a))
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unit.0.pt2 not loaded" in warnings[0]
    assert (unit.loaded, unit.compiled) == (0, 1) and (store / "unit.0.pt2").stat().st_size > 1000


def test_an_unserializable_trace_falls_back_to_plain_compile(unit_module, tmp_path, caplog):
    # the CustomOpDef wrapper (what torch.library.custom_op returns) cannot be pickled: the first
    # version of the slow layer closed over it
    _, mod = unit_module
    unit = mod.precompiled(tmp_path / "pre", op=mod.scaled_add)
    a = mod.args(3)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        torch.testing.assert_close(unit(*a), mod.eager()(*a))
        torch.testing.assert_close(unit(*mod.args(6)), mod.eager()(*mod.args(6)))
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "compiled the plain way" in warnings[0]
    assert unit._fallback is not None and not list((tmp_path / "pre").glob("*.pt2"))


def test_an_unwritable_store_keeps_the_traced_variant(unit_module, tmp_path, caplog):
    _, mod = unit_module
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the directory should be")
    unit = mod.precompiled(blocked)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        for batch in (3, 6):
            a = mod.args(batch)
            torch.testing.assert_close(unit(*a), mod.eager()(*a))
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "not saved" in warnings[0]
    assert (unit.compiled, unit._fallback) == (1, None)  # traced once, no second (plain) compile


def test_the_engine_precompiles_into_its_cache_and_has_an_off_switch(tmp_path):
    from conftest import MODEL_DIR

    from ttsengine import Engine, EngineConfig

    base = EngineConfig(model_dir=MODEL_DIR, device="cpu", features="+compile", max_batch=4, cache_dir=tmp_path)
    for config, want in ((base, "0 loaded, 0 traced"), (base.with_(features="+compile,-precompile"), "off"),
                         (base.with_(cache_dir=None), "off")):  # nowhere to keep them
        engine = Engine.load(config, start=False)  # built, not warmed up: nothing compiles here
        try:
            assert engine.precompiled == want and engine.stats().precompiled == want
            if want != "off":
                assert engine.runner.ops.slow_layer.directory == engine.kernel_cache.precompiled_dir
                assert engine.kernel_cache.precompiled_dir.parent == tmp_path
        finally:
            engine.close()
