"""BatchSettings.resolve: 'auto' values decided once from the config and the device (CPU here)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine import EngineConfig
from ttsengine.engine.loader import load
from ttsengine.engine.settings import (
    BatchSettings,
    CodecSwitches,
    codec_channels_last,
    codec_switches,
    cudnn_autotune_mode,
)
from ttsengine.model.quant import Int8Linear


@pytest.fixture(scope="module")
def ckpt():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


@pytest.mark.parametrize("merge, rows", [("auto", 8), ("on", 8), ("off", 0)])
def test_codec_merge_follows_the_switch(ckpt, merge, rows):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8, codec_merge=merge), ckpt)
    assert s.codec_merge_rows == rows


@pytest.mark.parametrize("value", ["auto", "on", "off"])
def test_cudnn_autotune_is_off_on_cpu(ckpt, value):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", cudnn_benchmark=value), ckpt)
    assert s.cudnn_autotune == "off"


@pytest.mark.parametrize("switch, graphs, want", [
    ("auto", True, "graphs"),  # the default: only inside the codec's capture windows
    ("auto", False, "off"),  # no graphs: no window that keeps the tuned algorithms
    ("on", True, "process"), ("on", False, "process"), ("off", True, "off")])
def test_cudnn_autotune_mode_on_cuda(switch, graphs, want):
    assert cudnn_autotune_mode(switch, cuda=True, graphs=graphs) == want


def test_cpu_defaults(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu"), ckpt)
    assert not s.cuda_graphs and not s.compile and not s.snake_kernel and s.buckets[-1] == 8


def test_fused_kernels_resolve_per_device():
    from ttsengine.engine.settings import fused_kernels
    from ttsengine.model.kernels.triton_support import triton_available, triton_major

    assert fused_kernels("off", True, True) == frozenset()
    assert fused_kernels("auto", False, False) == frozenset()  # CPU: the reference step
    triton_ones = ({"fast_attention"} if triton_available() else set()) | \
        ({"codebook_sampler", "vocab_sampler", "layer_gemv", "step_glue"} if triton_major() >= 3 else set())
    everything = {"vocab_scan", "merged_ffn"} | triton_ones
    assert fused_kernels("auto", True, True) == everything
    assert not {"fast_attention", "layer_gemv"} & fused_kernels("auto", True, False)  # fp32 cache: no 16-bit kernel
    # pdl where the device launches programmatic dependents, and only with layer_gemv (whose kernels take it)
    assert fused_kernels("auto", True, True, True) == everything | ({"pdl"} if "layer_gemv" in everything else set())
    assert "pdl" not in fused_kernels("auto", True, False, True)
    # a named list as asked (CPU tests run the fast attention's reference path), but never the samplers on CPU
    assert fused_kernels("fast_attention,codebook_sampler,vocab_sampler,step_glue", False, False) == {"fast_attention"}


def test_named_fused_kernels_need_their_triton(monkeypatch):
    # a CUDA machine whose Triton is 2.x (the torch 2.2 lane's): the samplers run, step_glue's aranges would not
    from ttsengine.engine import settings

    monkeypatch.setattr(settings, "triton_available", lambda: True)
    monkeypatch.setattr(settings, "triton_major", lambda: 2)
    assert settings.fused_kernels("codebook_sampler,vocab_sampler,step_glue", True, True) == {
        "codebook_sampler", "vocab_sampler"}
    monkeypatch.setattr(settings, "triton_major", lambda: 3)
    assert "step_glue" in settings.fused_kernels("step_glue", True, True)
    monkeypatch.setattr(settings, "triton_available", lambda: False)
    assert settings.fused_kernels("codebook_sampler,step_glue,merged_ffn", True, True) == {"merged_ffn"}


def test_codec_channels_last_auto_needs_cuda_and_tuned_convs():
    # auto: CUDA with cuDNN tuning the codec's convs (untuned heuristics made the time-major codec 10x slower at one
    # stream); on / off as asked
    assert codec_channels_last("auto", True, "graphs") and codec_channels_last("auto", True, "process")
    assert not codec_channels_last("auto", True, "off") and not codec_channels_last("auto", False, "off")
    assert codec_channels_last("on", False, "off") and not codec_channels_last("off", True, "graphs")


def test_codec_switches_follow_the_engines_rules(monkeypatch):
    # what bench --codec-only's engine mode builds its codec from: the switches the engine resolves
    from ttsengine.engine import settings

    monkeypatch.setattr(settings, "triton_available", lambda: True)
    cfg = EngineConfig(model_dir=MODEL_DIR)
    gpu = codec_switches(cfg, True, True, True)  # a GPU with graphs and compile: tuned in captures, time-major
    assert gpu == CodecSwitches(compile=False, snake_kernel=True, cudnn_autotune="graphs", channels_last=True)
    assert gpu.describe() == "time-major, Snake kernel, cuDNN tuned in graph captures"
    assert codec_switches(cfg, True, False, True).describe() == "channel-major, Snake kernel, cuDNN untuned"
    assert codec_switches(cfg, False, False, False).describe() == "channel-major, cuDNN untuned"  # CPU
    no_snake = codec_switches(EngineConfig(model_dir=MODEL_DIR, snake_kernel="off"), True, True, True)
    assert not no_snake.snake_kernel and no_snake.channels_last
    assert codec_switches(EngineConfig(model_dir=MODEL_DIR, cudnn_benchmark="on"), True, True, True
                          ).cudnn_autotune == "process"
    compiled = codec_switches(EngineConfig(model_dir=MODEL_DIR, codec_compile="on"), True, True, True)
    assert compiled.compile and not compiled.snake_kernel  # the compiled codec fuses Snake itself
    assert not codec_switches(EngineConfig(model_dir=MODEL_DIR, codec_compile="on"), True, True, False).compile


def test_batch_settings_hold_the_codec_switches(ckpt):
    cfg = EngineConfig(model_dir=MODEL_DIR, device="cpu", codec_channels_last="on")
    s = BatchSettings.resolve(cfg, ckpt)
    sw = codec_switches(cfg, False, s.cuda_graphs, s.compile)
    assert sw.channels_last and s.codec_channels_last  # the switch asked for, in both
    assert (s.codec_compile, s.snake_kernel, s.cudnn_autotune, s.codec_channels_last) == (
        sw.compile, sw.snake_kernel, sw.cudnn_autotune, sw.channels_last)


@pytest.mark.parametrize("switch, on", [("auto", True), ("on", True), ("off", False)])
def test_codec_rounds_follow_the_switch(ckpt, switch, on):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", codec_rounds=switch), ckpt)
    assert s.codec_rounds is on


def test_a_prefill_group_outside_its_values_is_a_config_error(ckpt):
    from ttsengine.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prefill_group=12: give one of 8, 16, 32, 64 \(TTS_PREFILL_GROUP\)"):
        BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", prefill_group=12), ckpt)


@pytest.mark.parametrize("group, rows", [(8, (1, 2, 4, 8)), (32, (1, 2, 4, 8, 16, 32))])
def test_the_prefill_group_reaches_the_runner(ckpt, group, rows):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", prefill_group=group), ckpt)
    assert s.runner.prefill_group == group
    from ttsengine import Engine

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, prefill_group=group))
    try:
        assert eng.runner.prefill_rows == rows
    finally:
        eng.close()


@pytest.mark.parametrize("on", [True, False])
def test_the_pinned_copy_switch_reaches_the_vocoder(on):
    from ttsengine import Engine

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2, codec_pinned_copy=on))
    try:  # on a CPU codec the switch is kept but has nothing to do (Vocoder._decode_deliver: CUDA only)
        assert eng.settings.codec_pinned_copy is on and eng.vocoder.pinned_copy is on
    finally:
        eng.close()


@pytest.mark.parametrize("one_row, buckets, warm", [(True, (1, 2, 4, 8), (1, 2)), (False, (2, 4, 8), (2,))])
def test_compiled_buckets_start_at_one_row_unless_off(ckpt, one_row, buckets, warm):
    from ttsengine.compat import compile_supported

    if not compile_supported():
        pytest.skip("torch.compile is not supported by this torch")
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8, compile="on",
                                           one_row_bucket=one_row), ckpt)
    # a lone stream steps at one row (its own compiled variant); warm-up compiles it and the dynamic variant (2)
    assert s.compile and (s.buckets, s.warm_buckets) == (buckets, warm)
    assert s.bucket(1) == buckets[0] and s.bucket(3) == 4


def test_without_compile_buckets_start_at_one_row_and_only_it_warms_up(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8, compile="off",
                                           one_row_bucket=False), ckpt)
    assert (s.buckets, s.warm_buckets) == ((1, 2, 4, 8), (1,))


def test_one_slot_engine_has_one_bucket(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=1), ckpt)
    assert (s.buckets, s.warm_buckets) == ((1,), (1,))


@pytest.mark.parametrize("rows", [-1, 65])
def test_layer_gemv_rows_outside_its_range_is_a_config_error(ckpt, rows):
    # the env var is range-checked where it is read; a Python caller's value here, with the same words
    from ttsengine.errors import ConfigError

    with pytest.raises(ConfigError, match="layer_gemv_rows"):
        BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", layer_gemv_rows=rows), ckpt)
    assert BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", layer_gemv_rows=64),
                                 ckpt).runner.gemv_rows == 64


def test_layer_gemv_rows_auto_is_64_only_with_pdl_and_16_bit_weights(ckpt):
    # 0 (the default): the 64-row tiles where they were measured faster (H100 with PDL, bf16), else 16
    import copy

    from ttsengine.engine import settings

    assert BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu"), ckpt).runner.gemv_rows == 16
    bf16 = copy.deepcopy(ckpt.model).to(torch.bfloat16)
    pdl = frozenset({"layer_gemv", "pdl"})
    assert settings.auto_gemv_rows(bf16, frozenset({"layer_gemv"})) == 16  # no PDL
    assert settings.auto_gemv_rows(bf16, pdl) == 64
    assert settings.auto_gemv_rows(ckpt.model, pdl) == 16  # fp32 weights
    int8 = copy.deepcopy(bf16)
    int8.layers[0].attention.wqkv = Int8Linear(int8.layers[0].attention.wqkv, "legacy")
    assert settings.auto_gemv_rows(int8, pdl) == 16
    assert BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", layer_gemv_rows=8),
                                 ckpt).runner.gemv_rows == 8  # a value given wins
