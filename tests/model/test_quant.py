"""Weight-only quantization on the tiny model: smaller, close to fp32, and the engines run with it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import MODEL_DIR
from safetensors.torch import load_file

from ttsengine import ConfigError, Engine, EngineConfig, SynthesisRequest, compat, from_env
from ttsengine.model import quant
from ttsengine.model.kernels import int8 as int8_triton
from ttsengine.model.kernels.triton_support import triton_available
from ttsengine.model.layers import causal_mask_from_positions
from ttsengine.model.loading.checkpoint import load_checkpoint
from ttsengine.model.quant import Int8Linear, quantize, weight_bytes


def logits(ck, prompt):
    T = prompt.shape[-1]
    pos = torch.arange(T)[None]
    with torch.inference_mode():
        return ck.model.slow_head(ck.model.slow_forward(ck.model.embed(prompt[None]), pos,
                                                        causal_mask_from_positions(pos, T)))[0]


@pytest.mark.parametrize("torchao", [True, False])
def test_int8_is_smaller_and_close(monkeypatch, torchao):
    """CPU: `auto` keeps the previous path (torchao when installed, else the legacy built-in)."""
    if not torchao:
        monkeypatch.setitem(sys.modules, "torchao", None)  # the built-in int8 linear
    ref, q = load_checkpoint(MODEL_DIR), load_checkpoint(MODEL_DIR)
    done = quantize(q.model, "int8")
    assert done.startswith("int8 (") and ("torchao" in done) == (torchao and "built-in" not in done)
    assert weight_bytes(q.model) < 0.6 * weight_bytes(ref.model)
    prompt = load_file(str(MODEL_DIR.parent / "prompts.safetensors"))["prompt_b"]
    a, b = logits(ref, prompt), logits(q, prompt)
    assert ((a - b).norm() / a.norm()).item() < 0.03
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.95


def test_builtin_int8_linear_matches_its_dequantized_weights():
    lin = torch.nn.Linear(32, 48)
    q = Int8Linear(lin)
    x = torch.randn(5, 32)
    w = q.weight_int8.float() * q.scale[:, None]
    assert torch.allclose(q(x), x @ w.T + lin.bias, atol=1e-5)
    assert (w - lin.weight).abs().max() <= q.scale.max() / 2 + 1e-6  # rounding error at most half a step


@pytest.mark.parametrize("kernel", ["fused", "tile", "dequant"])
def test_int8_kernels_are_smaller_and_close(kernel):
    ref, q = load_checkpoint(MODEL_DIR), load_checkpoint(MODEL_DIR)
    done = quantize(q.model, "int8", kernel)
    assert done.startswith(f"int8 (built-in int8 linear, {kernel}")
    assert {m.kernel for m in q.model.modules() if isinstance(m, Int8Linear)} == {kernel}
    assert weight_bytes(q.model) < 0.6 * weight_bytes(ref.model)
    prompt = load_file(str(MODEL_DIR.parent / "prompts.safetensors"))["prompt_b"]
    a, b = logits(ref, prompt), logits(q, prompt)
    assert ((a - b).norm() / a.norm()).item() < 0.03
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", ["fused", "tile", "dequant", "legacy"])
def test_int8_linear_equals_dequantized_reference(kernel, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=bias)
    q = Int8Linear(lin, kernel)
    w = q.weight_int8.float() * q.scale[:, None]  # the dequantized weight
    with torch.inference_mode():
        for shape in [(3, 96), (4, 1, 96), (2, 5, 96)]:
            x = torch.randn(shape)
            expect = x @ w.T + (lin.bias if bias else 0)
            torch.testing.assert_close(q(x), expect, rtol=1e-5, atol=1e-5)


def test_off_switch_selects_the_previous_path(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    fused_ok = compat.custom_ops_available() and triton_available()
    assert quant.resolve_int8_kernel(None, cuda) == ("fused" if fused_ok else "off")  # default: auto
    assert quant.resolve_int8_kernel(None, cpu) == "off"
    assert quant.resolve_int8_kernel("dequant", cuda) == "dequant"
    assert quant.resolve_int8_kernel("tile", cuda) == "tile"  # the GEMV kernel's off switch
    assert from_env({"TTS_INT8_KERNEL": "tile"}).int8_kernel == "tile"
    assert quant.resolve_int8_kernel("off", cuda) == "off"
    assert from_env({"TTS_INT8_KERNEL": "off"}).int8_kernel == "off"  # the switch, read once by config
    monkeypatch.setitem(sys.modules, "torchao", None)  # the previous path without torchao: legacy built-in
    ck = load_checkpoint(MODEL_DIR)
    assert quantize(ck.model, "int8", "fused").startswith("int8 (built-in int8 linear, fused")  # argument wins
    ck = load_checkpoint(MODEL_DIR)
    assert quantize(ck.model, "int8").startswith("int8 (built-in int8 linear, ")
    assert {m.kernel for m in ck.model.modules() if isinstance(m, Int8Linear)} == {"legacy"}
    with pytest.raises(ConfigError, match="TTS_INT8_KERNEL"):
        quantize(load_checkpoint(MODEL_DIR).model, "int8", "fast")
    with pytest.raises(ConfigError, match="TTS_INT8_KERNEL"):
        from_env({"TTS_INT8_KERNEL": "fast"})


@pytest.mark.skipif(not compat.compile_supported(), reason="torch.compile of the step needs torch >= 2.6")
@pytest.mark.parametrize("kernel", ["fused", "dequant"])
def test_compiled_int8_linear_is_not_rewritten_to_weight_int8pack_mm(kernel):
    """Inductor rewrites `F.linear(x, w_int8.to(bf16)) * scale` (legacy, torchao) into
    aten._weight_int8pack_mm, whose CUDA kernel was ~24x slower than bf16; ours stay as written."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    q = Int8Linear(lin, kernel)
    fn = torch.compile(lambda mod, x: mod(x), fullgraph=True)
    w = q.weight_int8.float() * q.scale[:, None]
    with torch.inference_mode():
        for rows in (3, 6):
            x = torch.randn(rows, 1, 64).to(torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
            torch.testing.assert_close(fn(q, x).float(), x.float() @ w.T, rtol=2e-2, atol=2e-2)
    assert not counters["inductor"].get("woq_matcher_count")


def _triton_major() -> int:
    import triton

    return int(triton.__version__.split(".")[0])


@pytest.mark.skipif(not triton_available() or (not torch.cuda.is_available() and _triton_major() < 3),
                    reason="needs a GPU or Triton >= 3 (its interpreter)")
@pytest.mark.parametrize("rows,n,k,bias", [(1, 40, 200, True), (2, 48, 64, True), (5, 100, 48, False),
                                           (37, 64, 256, True), (70, 33, 96, True), (2, 20, 2100, False)])
def test_triton_int8_kernels_match_reference(rows, n, k, bias):
    """Both kernels' indexing (row/column tails, K not a multiple of the tile, bias, the 3-D
    accumulator of long K) on Triton's interpreter when there is no GPU (fp16: it has no bf16)."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lin = torch.nn.Linear(k, n, bias=bias).half().to(dev)
    q = Int8Linear(lin, "fused")
    x = torch.randn(rows, k, device=dev).half()
    expect = x.float() @ (q.weight_int8.float() * q.scale[:, None]).T + (lin.bias.float() if bias else 0)
    configs = [None, {"BM": 16, "BN": 16, "BK": 32, "num_warps": 4, "num_stages": 3}]
    if rows <= 4:
        configs += [int8_triton.gemv_config(k), {**int8_triton.gemv_config(k), "ACC3": k <= 1024, "BN": 8}]
    for cfg in configs:
        y = int8_triton.int8_linear_triton(x, q.weight_int8, q.scale, q.bias, cfg)
        assert y.dtype == torch.float16 and y.shape == (rows, n)
        torch.testing.assert_close(y.float(), expect, rtol=2e-3, atol=2e-3)


def test_gemv_kernel_is_chosen_for_one_or_two_rows_and_has_an_off_switch():
    cfg = int8_triton.int8_linear_config
    assert cfg(2, 1024, 3072, sms=132)["kernel"] == "gemv" and cfg(1, 4096, 1024, sms=132)["kernel"] == "gemv"
    assert cfg(3, 1024, 3072, sms=132)["kernel"] == "tile"
    assert cfg(2, 155776, 1024, sms=132)["kernel"] == "tile"  # the vocabulary head reads faster in wide tiles
    assert cfg(2, 1024, 3072, sms=132, gemv_rows=0)["kernel"] == "tile"
    assert Int8Linear(torch.nn.Linear(16, 8), "fused").gemv_rows == int8_triton.GEMV_MAX_ROWS
    assert Int8Linear(torch.nn.Linear(16, 8), "tile").gemv_rows == 0


def test_bad_modes():
    ck = load_checkpoint(MODEL_DIR)
    with pytest.raises(ConfigError, match="not one of"):
        quantize(ck.model, "int3")
    with pytest.raises(ConfigError, match="int4 needs a CUDA device"):
        quantize(ck.model, "int4")


def test_engine_serves_int8():
    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", quant="int8", max_batch=2))
    try:
        r = eng.synthesize(SynthesisRequest(text="Quantized voice.", seed=1, max_new_tokens=12))
        assert r.frames == 11 and np.isfinite(r.audio).all()
        assert eng.stats().quantization.startswith("DualAR int8")
    finally:
        eng.close()


def test_int8_tile_rules_reproduce_the_measured_table(monkeypatch):
    table = dict(int8_triton.INT8_TILE_TABLE)
    monkeypatch.setattr(int8_triton, "INT8_TILE_TABLE", {})
    for (cls, n, k), cfg in table.items():
        rule = int8_triton.int8_linear_config(2 if cls == "s" else 64, n, k, sms=132, gemv_rows=0)
        assert {t: rule[t] for t in ("BM", "BN", "BK")} == {t: cfg[t] for t in ("BM", "BN", "BK")}
    big = int8_triton.int8_linear_config(4096, 1024, 1024, sms=132)  # prefill: a GEMM tiling, BK capped by K
    assert big["BM"] == 64 and big["BK"] <= 1024
    assert int8_triton.int8_linear_config(4, 40, 24, sms=132)["BK"] == 32  # K smaller than the tile


@pytest.mark.gpu
@pytest.mark.skipif(compat.torchao_version() is None or not torch.cuda.is_available(),
                    reason="int4 needs torchao and a CUDA device")
def test_int4_on_gpu_is_smaller_close_and_takes_strided_inputs():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256)).to("cuda", torch.bfloat16)
    q = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256)).to("cuda", torch.bfloat16)
    q.load_state_dict(ref.state_dict())
    done = quantize(q, "int4")
    assert done.startswith("int4 (torchao") and weight_bytes(q) < 0.5 * weight_bytes(ref)
    x = torch.randn(6, 2, 512, device="cuda", dtype=torch.bfloat16).transpose(0, 1)  # strided, like the step's
    with torch.inference_mode():
        a, b = ref(x).float(), q(x).float()
    # 4-bit groups of 128 of uniform weights: ~7% error per layer, ~10% after two; garbage would be ~100%
    assert ((a - b).norm() / a.norm()).item() < 0.2
