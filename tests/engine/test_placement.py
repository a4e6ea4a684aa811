"""TTS_DEVICES / TTS_TOPOLOGY -> one engine config per engine, for any number of GPUs (no GPU needed)."""

from __future__ import annotations

import pytest

from ttsengine import ConfigError, EngineConfig, from_env
from ttsengine.engine.placement import GpuView, Placement, engine_configs, gpu_view, placements


def where(cuda_count: int, **env) -> list[tuple[str, str]]:
    return [(p.device, p.codec_device) for p in placements(from_env(env), cuda_count)]


def test_auto_is_every_visible_gpu_else_one_cpu_engine():
    assert where(0) == [("cpu", "cpu")]
    assert where(1) == [("cuda:0", "cuda:0")]
    assert where(4) == [(f"cuda:{i}", f"cuda:{i}") for i in range(4)]


def test_tts_device_alone_still_means_one_engine_there():
    assert where(4, TTS_DEVICE="cuda:2") == [("cuda:2", "cuda:2")]
    assert where(2, TTS_DEVICE="cpu") == [("cpu", "cpu")]
    assert where(2, TTS_DEVICE="cpu", TTS_DEVICES="cuda:1") == [("cuda:1", "cuda:1")]  # the list wins


def test_lists_with_repeats_and_spaces():
    assert where(0, TTS_DEVICES="cpu,cpu") == [("cpu", "cpu"), ("cpu", "cpu")]
    assert where(2, TTS_DEVICES=" CUDA:1 , cuda") == [("cuda:1", "cuda:1"), ("cuda:0", "cuda:0")]


def test_split_pairs_devices_in_order():
    assert where(4, TTS_TOPOLOGY="split") == [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]
    assert where(0, TTS_DEVICES="cpu,cpu", TTS_TOPOLOGY="split") == [("cpu", "cpu")]


@pytest.mark.parametrize("cuda_count, env, words", [
    (0, {"TTS_DEVICES": "cuda:0"}, "TTS_DEVICES: cuda:0 asked for, but CUDA is not available"),
    (2, {"TTS_DEVICES": "cuda:0,cuda:2"}, "this machine has 2 CUDA device(s) (cuda:0..cuda:1)"),
    (3, {"TTS_TOPOLOGY": "split"}, "TTS_TOPOLOGY=split pairs devices (DualAR, codec): 3 listed (cuda:0,cuda:1,cuda:2)"),
    (1, {"TTS_DEVICE": "cuda:3"}, "TTS_DEVICE: cuda:3 asked for, but this machine has 1 CUDA device(s)"),
])
def test_impossible_placements_say_what_and_where(cuda_count, env, words):
    with pytest.raises(ConfigError) as e:
        placements(from_env(env), cuda_count)
    assert words in str(e.value)


@pytest.mark.parametrize("value", ["cuda:x", "tpu", "cpu,,cpu", "auto,cpu"])
def test_bad_lists_are_refused_when_read(value):
    with pytest.raises(ConfigError, match="TTS_DEVICES"):
        from_env({"TTS_DEVICES": value})


def test_engines_on_one_device_split_its_kv_memory_in_build_order():
    configs = engine_configs(EngineConfig(devices="cuda:0,cuda:1,cuda:0"), 2)
    assert [(c.device, c.codec_device, c.kv_share) for c in configs] == \
           [("cuda:0", "cuda:0", 2), ("cuda:1", "cuda:1", 1), ("cuda:0", "cuda:0", 1)]
    assert Placement("cuda:0", "cuda:1") == placements(EngineConfig(devices="cuda:0,cuda:1", topology="split"), 2)[0]


def test_the_failure_hook_is_checked_when_read():
    assert from_env({"TTS_TEST_FAIL_ENGINE": "1@5"}).fail_engine == "1@5"
    with pytest.raises(ConfigError, match="TTS_TEST_FAIL_ENGINE"):
        from_env({"TTS_TEST_FAIL_ENGINE": "one"})


@pytest.mark.parametrize("devices, inherited, want", [
    ("cuda:1", None, GpuView("1", "cuda:0", {"cuda:0": "cuda:1"})),
    ("cuda:3", "4,5,6,7", GpuView("7", "cuda:0", {"cuda:0": "cuda:3"})),  # the front's own list is what N counts
    ("cuda:2,cuda:2", None, GpuView("2", "cuda:0,cuda:0", {"cuda:0": "cuda:2"})),  # two engines sharing a GPU
    ("cuda:3,cuda:1", "GPU-a, GPU-b,GPU-c,GPU-d", GpuView("GPU-d,GPU-b", "cuda:0,cuda:1",  # a split pair, UUIDs
                                                          {"cuda:0": "cuda:3", "cuda:1": "cuda:1"})),
    ("cuda:0,cpu", None, GpuView("0", "cuda:0,cpu", {"cuda:0": "cuda:0"})),
])
def test_an_engine_process_sees_its_gpus_from_cuda_0(devices, inherited, want):
    assert gpu_view(devices, inherited) == want


@pytest.mark.parametrize("devices, inherited", [("cpu", None), ("cpu,cpu", "0"), ("auto", None), ("cuda", None),
                                                ("cuda:2", "0,1"), ("cuda:0", "")])
def test_gpu_view_leaves_what_it_cannot_map_as_inherited(devices, inherited):
    assert gpu_view(devices, inherited) == GpuView(None, devices, {})
