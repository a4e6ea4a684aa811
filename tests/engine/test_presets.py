"""Memory presets: which GPU gets which preset, how the KV pool is sized within the memory share, overrides."""

from __future__ import annotations

import pytest
from conftest import MODEL_DIR

from ttsengine import EngineConfig
from ttsengine.config import _PRESET_WORDS, from_env
from ttsengine.engine import presets
from ttsengine.engine.loader import load
from ttsengine.engine.settings import BatchSettings
from ttsengine.errors import ConfigError

GB = 1 << 30


@pytest.mark.parametrize("name, memory_gb, want", [
    ("NVIDIA H100 80GB HBM3", 79.6, "h100"),
    ("NVIDIA H100 PCIe", 79.6, "h100"),
    ("NVIDIA H200", 139.8, "h200"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
    ("NVIDIA L40S", 44.4, "l40s"),
    ("NVIDIA A10G", 22.0, "a10g"),
    ("NVIDIA L4", 22.0, "l4"),
    ("NVIDIA GeForce RTX 4090", 23.6, "rtx-4090"),
    ("NVIDIA GeForce RTX 5090", 31.4, "rtx-5090"),
    ("Some Future GPU", 192.0, "gpu-100gb"),
    ("Some Small GPU", 11.0, "gpu-small"),
])
def test_gpu_classes_pick_their_preset(name, memory_gb, want):
    assert presets.choose(name, int(memory_gb * GB)).name == want


def test_cpu_and_names():
    assert presets.choose(None, 0) is presets.CPU
    assert set(_PRESET_WORDS) == {"auto", *presets.NAMES}  # the env switch accepts exactly the table's names
    assert presets.by_name("l4").max_batch == 48
    with pytest.raises(ConfigError, match="not one of auto, h200"):
        presets.by_name("h300")
    with pytest.raises(ConfigError, match="TTS_MEMORY_PRESET"):
        from_env({"TTS_MEMORY_PRESET": "h300"})


def test_kv_share_is_the_memory_share_less_weights_and_reserve():
    # H100: 80 GB, 0.3 of it, 4 GB of weights, 3 GB reserve -> 17 GB, whatever else is free
    assert presets.kv_bytes(80 * GB, 75 * GB, 4 * GB, 3 * GB, 0.3) == int(80 * GB * 0.3) - 7 * GB
    # another process holds most of the GPU: never more than is free
    assert presets.kv_bytes(80 * GB, 10 * GB, 4 * GB, 3 * GB, 0.85) == 7 * GB
    assert presets.kv_bytes(80 * GB, 75 * GB, 4 * GB, 3 * GB, 0.05) == 0


@pytest.fixture(scope="module")
def ckpt():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu"))


def test_settings_take_the_preset_and_the_overrides(ckpt):
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu"), ckpt)
    assert s.preset.name == "cpu" and s.max_slots == 8
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", memory_preset="l4"), ckpt)
    assert (s.preset.name, s.max_slots, s.buckets[-1]) == ("l4", 48, 48)
    assert s.kv_positions == 48 * 1024  # the preset's positions per stream x its streams (the tiny model fits)
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", memory_preset="l4", max_batch=5,
                                           kv_cache_tokens=1000), ckpt)
    assert (s.max_slots, s.preset.max_batch, s.kv_positions) == (5, 5, 1024)  # 1000 rounded up to whole pages
    assert s.preset.as_dict() == {"name": "l4", "max_batch": 5, "positions_per_stream": 1024,
                                  "memory_utilization": 0.85}
    s = BatchSettings.resolve(EngineConfig(model_dir=MODEL_DIR, device="cpu", gpu_memory_utilization=0.3), ckpt)
    assert s.preset.memory_utilization == 0.3


def test_utilization_is_range_checked():
    assert from_env({"TTS_GPU_MEMORY_UTILIZATION": "0.3"}).gpu_memory_utilization == 0.3
    for bad in ("1.5", "-0.1", "most"):
        with pytest.raises(ConfigError, match="TTS_GPU_MEMORY_UTILIZATION"):
            from_env({"TTS_GPU_MEMORY_UTILIZATION": bad})
