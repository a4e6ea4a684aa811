"""BatchSettings.resolve: 'auto' values decided once from the config and the device (CPU here)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine import EngineConfig
from ttsengine.engine import features as F
from ttsengine.engine.features import Platform, resolve
from ttsengine.engine.loader import load
from ttsengine.engine.settings import (
    BatchSettings,
    CodecSwitches,
    codec_switches,
    cudnn_autotune_mode,
)
from ttsengine.model.quant import Int8Linear

GPU = Platform(cuda=True, triton=True, triton_major=3, sixteen_bit=True)


@pytest.fixture(scope="module")
def ckpt():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


@pytest.mark.parametrize("merge, rows", [("auto", 8), ("+codec_merge", 8), ("-codec_merge", 0)])
def test_codec_merge_follows_the_switch(ckpt, merge, rows):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8, features=merge), ckpt)
    assert s.codec_merge_rows == rows


@pytest.mark.parametrize("value", ["auto", "+cudnn_benchmark", "+cudnn_tuning", "-cudnn_tuning"])
def test_cudnn_autotune_is_off_on_cpu(ckpt, value):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", features=value), ckpt)
    assert s.cudnn_autotune == "off"


@pytest.mark.parametrize("text, want", [
    ("auto", "graphs"),  # the default: only inside the codec's capture windows
    ("-cuda_graphs", "off"),  # no graphs: no window that keeps the tuned algorithms
    ("+cudnn_benchmark", "process"), ("-cuda_graphs,+cudnn_benchmark", "process"), ("-cudnn_tuning", "off")])
def test_cudnn_autotune_mode_on_cuda(text, want):
    assert cudnn_autotune_mode(resolve(text, GPU).on) == want


def test_cpu_defaults(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu"), ckpt)
    assert not s.cuda_graphs and not s.compile and not s.snake_kernel and s.buckets[-1] == 8


def test_cpu_defaults_are_what_they_were_before_the_registry(ckpt):
    # every switch at auto on a CPU, as BatchSettings.resolve gave it with the on/off variables
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu"), ckpt)
    assert (s.cuda_graphs, s.overlap_step, s.step_priority, s.lazy_graphs, s.prefill_graphs, s.compile) == (
        False, False, False, True, False, False)
    assert s.codec == CodecSwitches(compile=False, snake_kernel=False, cudnn_autotune="off", channels_last=False)
    assert (s.codec_merge_rows, s.codec_rounds, s.codec_pinned_copy) == (8, True, True)
    assert (s.buckets, s.warm_buckets, s.runner.fused, s.runner.gemv_rows, s.runner.triton_attention) == (
        (1, 2, 4, 8), (1,), frozenset(), 16, False)
    assert s.features == {F.ONE_ROW_BUCKET, F.LAZY_GRAPHS, F.CODEC_MERGE, F.CODEC_ROUNDS, F.CODEC_PINNED_COPY,
                          F.CODEC_CACHE, F.EARLY_READAHEAD,  # a start's, since stop 56
                          F.PLAIN_WEBSOCKET,  # the servers', since stop 57
                          F.DIRECT_ADMIT,  # since stop 58
                          F.PREFILL_FIT,  # since stop 59
                          F.OWN_GPU_VIEW, F.SHORT_SWITCH,  # since stop 62
                          F.RESAMPLE_THREAD,  # since stop 64
                          F.LAZY_COMPILER,  # since stop 65
                          F.EARLY_KERNELS,  # since stop 66
                          F.EARLY_JIT,  # since stop 67
                          F.GC_FREEZE, F.RUNPOD_COALESCE,  # since stop 68
                          F.RUNPOD_PICKUP}  # since stop 69


def test_named_kernels_reach_the_runner_and_those_that_cannot_run_warn(ckpt, caplog):
    # a CPU: the fast attention's reference path runs (CPU tests use it), the samplers' kernels would crawl in Triton's
    # interpreter; every feature turned off is off
    with caplog.at_level("WARNING", logger="ttsengine.engine.settings"):
        s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu",
                                               features="+fast_attention,codebook_sampler,-codec_merge"), ckpt)
    assert s.runner.fused == {F.FAST_ATTENTION} and s.codec_merge_rows == 0
    assert [r.getMessage().split(" needs ")[0] for r in caplog.records] == ["TTS_FEATURES: codebook_sampler"]
    assert caplog.records[0].getMessage().endswith("; it is off")  # "needs CUDA" (and Triton, where it is missing)
    from ttsengine.errors import ConfigError

    with pytest.raises(ConfigError, match=r"features='\+turbo': '\+turbo' is not a feature.* \(TTS_FEATURES\)"):
        BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", features="+turbo"), ckpt)


def test_the_platform_is_probed_from_the_device(monkeypatch):
    from ttsengine.engine import settings

    monkeypatch.setattr(settings, "triton_available", lambda: True)
    monkeypatch.setattr(settings, "triton_major", lambda: 2)
    p = settings.platform(torch.device("cpu"), True)
    assert (p.cuda, p.triton, p.triton_major, p.sixteen_bit, p.pdl) == (False, True, 2, True, False)


def test_codec_switches_follow_the_engines_rules():
    # what bench --codec-only's engine mode builds its codec from: the switches the engine resolves
    gpu = codec_switches(resolve("auto", GPU).on)  # a GPU with graphs and compile: tuned in captures, time-major
    assert gpu == CodecSwitches(compile=False, snake_kernel=True, cudnn_autotune="graphs", channels_last=True,
                                kv_ring=True, sparse_rows=True)
    assert gpu.describe() == "time-major, KV ring, rows 1/4/16/64, Snake kernel, cuDNN tuned in graph captures"
    assert codec_switches(resolve("-cuda_graphs,-codec_kv_ring,-codec_sparse_rows", GPU).on).describe() == \
        "channel-major, Snake kernel, cuDNN untuned"
    assert codec_switches(resolve("auto", Platform()).on).describe() == "channel-major, cuDNN untuned"  # CPU
    no_snake = codec_switches(resolve("-snake_kernel", GPU).on)
    assert not no_snake.snake_kernel and no_snake.channels_last
    assert codec_switches(resolve("+cudnn_benchmark", GPU).on).cudnn_autotune == "process"
    own = codec_switches(resolve("+codec_own_convs", GPU).on)  # opt-in: no cuDNN conv in the codec
    assert own.own_convs and own.describe() == \
        "time-major, KV ring, rows 1/4/16/64, Snake kernel, own convs, cuDNN tuned in graph captures"
    assert not codec_switches(resolve("+codec_own_convs,-codec_channels_last", GPU).on).own_convs  # needs time-major
    fused = codec_switches(resolve("+codec_own_convs,+codec_fused_convs", GPU).on)  # opt-in, on the own convs
    assert fused.fused_convs and fused.describe().endswith("own convs, fused epilogues, cuDNN tuned in graph captures")
    assert not codec_switches(resolve("+codec_fused_convs,-codec_own_convs", GPU).on).fused_convs
    compiling = Platform(cuda=True, triton=True, triton_major=3, compile=True)
    compiled = codec_switches(resolve("+codec_compile", compiling).on)
    assert compiled.compile and not compiled.snake_kernel  # the compiled codec fuses Snake itself
    assert not codec_switches(resolve("+codec_compile,-compile", compiling).on).compile
    # the channels-last layout: on by default with CUDA where cuDNN tunes the codec's convs (untuned heuristics made
    # the time-major codec 10x slower at one stream); asked for, it runs anywhere
    assert codec_switches(resolve("-cudnn_tuning,+cudnn_benchmark", GPU).on).channels_last
    assert not codec_switches(resolve("-cudnn_tuning", GPU).on).channels_last
    assert codec_switches(resolve("+codec_channels_last", Platform()).on).channels_last
    assert not codec_switches(resolve("-codec_channels_last", GPU).on).channels_last


def test_batch_settings_hold_the_codec_switches(ckpt):
    cfg = EngineConfig(model_dir=MODEL_DIR, device="cpu", features="+codec_channels_last")
    s = BatchSettings.resolve(cfg, ckpt)
    sw = codec_switches(s.features)
    assert sw.channels_last and s.codec_channels_last  # the switch asked for, in both
    assert (s.codec_compile, s.snake_kernel, s.cudnn_autotune, s.codec_channels_last) == (
        sw.compile, sw.snake_kernel, sw.cudnn_autotune, sw.channels_last)


@pytest.mark.parametrize("switch, on", [("auto", True), ("+codec_rounds", True), ("-codec_rounds", False)])
def test_codec_rounds_follow_the_switch(ckpt, switch, on):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", features=switch), ckpt)
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

    eng = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=2,
                                   features="+codec_pinned_copy" if on else "-codec_pinned_copy"))
    try:  # on a CPU codec the switch is kept but has nothing to do (Vocoder._decode_deliver: CUDA only)
        assert eng.settings.codec_pinned_copy is on and eng.vocoder.pinned_copy is on
    finally:
        eng.close()


@pytest.mark.parametrize("one_row, buckets, warm", [(True, (1, 2, 4, 8), (1, 2)), (False, (2, 4, 8), (2,))])
def test_compiled_buckets_start_at_one_row_unless_off(ckpt, one_row, buckets, warm):
    from ttsengine.compat import compile_supported

    if not compile_supported():
        pytest.skip("torch.compile is not supported by this torch")
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8,
                                           features="+compile" + ("" if one_row else ",-one_row_bucket")), ckpt)
    # a lone stream steps at one row (its own compiled variant); warm-up compiles it and the dynamic variant (2)
    assert s.compile and (s.buckets, s.warm_buckets) == (buckets, warm)
    assert s.bucket(1) == buckets[0] and s.bucket(3) == 4


def test_without_compile_buckets_start_at_one_row_and_only_it_warms_up(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8,
                                           features="-compile,-one_row_bucket"), ckpt)
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
    pdl = frozenset({F.LAYER_GEMV, F.PDL})
    assert settings.auto_gemv_rows(bf16, frozenset({F.LAYER_GEMV})) == 16  # no PDL
    assert settings.auto_gemv_rows(bf16, pdl) == 64
    assert settings.auto_gemv_rows(ckpt.model, pdl) == 16  # fp32 weights
    int8 = copy.deepcopy(bf16)
    int8.layers[0].attention.wqkv = Int8Linear(int8.layers[0].attention.wqkv, "legacy")
    assert settings.auto_gemv_rows(int8, pdl) == 16
    assert BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", layer_gemv_rows=8),
                                 ckpt).runner.gemv_rows == 8  # a value given wins
