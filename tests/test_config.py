"""Every config error path names the key and the file (or the env var)."""

from __future__ import annotations

import copy
import json
import re

import pytest
from conftest import GOLDEN, MODEL_DIR, ROOT

from ttsengine.config import ENV_VARS, OTHER_ENV_VARS, EngineConfig, from_env
from ttsengine.errors import ConfigError
from ttsengine.model.codec.config import S1_CODEC, load_codec_config, parse_codec_config
from ttsengine.model.dual_ar_config import load_dual_ar_config, parse_dual_ar_config

RAW = json.loads((MODEL_DIR / "config.json").read_text())


def _cfg_error(tmp_path, raw) -> str:
    path = tmp_path / "config.json"
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        load_dual_ar_config(path)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    return msg


def test_golden_config_resolves_fallbacks():
    cfg = load_dual_ar_config(MODEL_DIR)
    assert (cfg.slow.n_head, cfg.slow.n_local_heads, cfg.slow.head_dim) == (4, 2, 32)
    assert cfg.fast.qk_norm is False and cfg.slow.qk_norm is True
    assert cfg.fast.dim == 64 and cfg.cache_len == 4096 and not cfg.tie_word_embeddings


@pytest.mark.parametrize("change, pattern", [
    ({"bogus_key": 1}, r"unknown key\(s\) 'bogus_key'"),
    ({"n_head": 3}, r"key 'n_head': 3 is not divisible by n_local_heads=2"),
    ({"fast_n_head": 3}, r"key 'fast_n_head': 3 is not divisible by fast_n_local_heads=2"),
    ({"head_dim": 31}, r"key 'head_dim': must be even"),
    ({"dim": "64"}, r"key 'dim' has an invalid value '64'"),
    ({"dim": 0}, r"key 'dim': must be >= 1"),
    ({"n_fast_layer": -1}, r"key 'n_fast_layer': must be >= 1"),
    ({"attention_qk_norm": 1}, r"key 'attention_qk_norm' has an invalid value 1"),
    ({"model_type": "naive"}, r"key 'model_type' is 'naive'; only 'dual_ar'"),
    ({"is_reward_model": True}, r"reward models cannot synthesize"),
    ({"rope_base": 0}, r"key 'rope_base': must be > 0"),
])
def test_bad_values(tmp_path, change, pattern):
    assert re.search(pattern, _cfg_error(tmp_path, {**RAW, **change}))


def test_missing_required_key(tmp_path):
    raw = dict(RAW)
    del raw["head_dim"], raw["n_local_heads"]
    assert "missing required key(s) 'n_local_heads', 'head_dim'" in _cfg_error(tmp_path, raw)


def test_optional_keys_take_upstream_defaults():
    raw = {k: v for k, v in RAW.items() if not k.startswith("fast_") and k != "dropout"}
    raw["n_local_heads"] = -1
    cfg = parse_dual_ar_config(raw)
    assert cfg.slow.n_local_heads == cfg.slow.n_head == cfg.fast.n_local_heads
    assert cfg.fast.qk_norm is True  # inherits the slow flag when the file omits it


def test_unreadable_config(tmp_path):
    assert "not valid JSON" in _cfg_error(tmp_path, "{nope")
    assert "expected a JSON object" in _cfg_error(tmp_path, "[1]")
    with pytest.raises(ConfigError, match="file not found"):
        load_dual_ar_config(tmp_path / "absent.json")


def test_codec_config_golden_and_builtin():
    tiny = load_codec_config(MODEL_DIR)  # found beside the checkpoint folder, like the golden layout
    assert (tiny.frame_length, tiny.num_codebooks, tiny.pre_module.window) == (2048, 4, 4)
    s1 = parse_codec_config(S1_CODEC, "builtin")
    assert (s1.frame_length, s1.num_codebooks, s1.latent_dim, s1.post_module.window) == (2048, 10, 1024, 128)


def test_builtin_s1_shapes_have_the_published_parameter_counts():
    """Spec §2 and §7: S1-mini is 872,753,152 LLM parameters and 391,430,530 codec parameters
    (the codec file stores weight norm as g + v; we fold g into the weight, so add g back)."""
    import torch

    from ttsengine.model.codec import Codec
    from ttsengine.model.dual_ar import DualAR

    s1 = {**RAW, "dim": 1024, "n_layer": 28, "n_head": 16, "n_local_heads": 8, "head_dim": 128,
          "intermediate_size": 3072, "vocab_size": 155776, "codebook_size": 4096, "num_codebooks": 10,
          "n_fast_layer": 4, "fast_dim": 1024, "fast_n_head": 16, "fast_n_local_heads": 8, "fast_head_dim": 128,
          "fast_intermediate_size": 3072, "fast_attention_qk_norm": True, "max_seq_len": 8192}
    with torch.device("meta"):
        llm = DualAR(parse_dual_ar_config(s1), 151658, 155753)
        codec = Codec(parse_codec_config(S1_CODEC, "builtin"))
    assert sum(p.numel() for p in llm.parameters()) == 872_753_152
    convs = (torch.nn.Conv1d, torch.nn.ConvTranspose1d)
    weight_normed = [m for name, m in codec.named_modules() if isinstance(m, convs)
                     and (name.startswith(("encoder.", "decoder.")) or name.endswith(("in_proj", "out_proj")))]
    g = sum(m.weight.shape[0] for m in weight_normed)
    assert sum(p.numel() for p in codec.parameters()) + g == 391_430_530


@pytest.mark.parametrize("mutate, pattern", [
    (lambda c: c.update(bogus=1), r"unknown key\(s\) 'bogus'"),
    (lambda c: c["quantizer"].update(extra=2), r"unknown key\(s\) 'quantizer.extra'"),
    (lambda c: c.pop("decoder_dim"), r"missing key 'decoder_dim'"),
    (lambda c: c.update(decoder_rates=[8, 8, 4, 4]), r"must agree"),
    (lambda c: c["quantizer"]["pre_module"]["config"].update(head_dim=15), r"head_dim' must be even"),
    (lambda c: c["quantizer"]["pre_module"].update(input_dim=7), r"projections are not supported"),
    (lambda c: c.update(encoder_rates=[2, "x"]), r"key 'encoder_rates' has an invalid value"),
])
def test_codec_config_errors(mutate, pattern):
    raw = copy.deepcopy(S1_CODEC)
    mutate(raw)
    with pytest.raises(ConfigError, match=pattern):
        parse_codec_config(raw, "codec_config.json")


def test_engine_config_from_env():
    cfg = from_env({"TTS_MODEL_DIR": "/m", "TTS_DEVICE": "cpu", "TTS_CHUNK_LENGTH": "300",
                    "TTS_ALLOW_SPECIAL_TOKENS": "yes"})
    assert str(cfg.model_dir) == "/m" and cfg.device == "cpu" and cfg.chunk_length == 300
    assert cfg.allow_special_tokens is True
    assert from_env({}, device="cpu").model_dir == EngineConfig().model_dir
    speed = from_env({"TTS_CODEC_COMPILE": "on", "TTS_SNAKE_KERNEL": "off", "TTS_LAZY_GRAPHS": "0"})
    assert (speed.codec_compile, speed.snake_kernel, speed.lazy_graphs) == ("on", "off", False)
    assert (EngineConfig().codec_compile, EngineConfig().snake_kernel, EngineConfig().lazy_graphs) == \
           ("off", "auto", True)  # the defaults: a fast start


@pytest.mark.parametrize("env, pattern", [
    ({"TTS_CHUNK_LENGTH": "abc"}, r"TTS_CHUNK_LENGTH='abc': expected int"),
    ({"TTS_CHUNK_LENGTH": "10"}, r"TTS_CHUNK_LENGTH: 10 is outside 50..1000"),
    ({"TTS_DEVICE": "tpu"}, r"TTS_DEVICE: 'tpu' is not one of"),
    ({"TTS_DTYPE": "int3"}, r"TTS_DTYPE: 'int3' is not one of"),
    ({"TTS_ALLOW_SPECIAL_TOKENS": "maybe"}, r"TTS_ALLOW_SPECIAL_TOKENS='maybe': expected bool"),
    ({"TTS_CODEC_COMPILE": "auto"}, r"TTS_CODEC_COMPILE: 'auto' is not one of on, off"),
    ({"TTS_SNAKE_KERNEL": "on"}, r"TTS_SNAKE_KERNEL: 'on' is not one of auto, off"),
    ({"TTS_PRECOMPILE": "on"}, r"TTS_PRECOMPILE: 'on' is not one of auto, off"),
    ({"TTS_LAZY_GRAPHS": "later"}, r"TTS_LAZY_GRAPHS='later': expected bool"),
])
def test_engine_config_errors(env, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_env(env)


def test_readme_lists_every_env_var():
    readme = (ROOT / "README.md").read_text()
    table = set(re.findall(r"^\|\s*`([A-Z][A-Z0-9_]+)`\s*\|", readme, flags=re.M))
    names = set(ENV_VARS) | set(OTHER_ENV_VARS)
    assert names <= table, f"README table lacks {sorted(names - table)}"
    assert not {n for n in table if n.startswith("TTS_")} - names, "README lists TTS_ vars config.py does not know"


def test_codec_config_lookup_prefers_the_model_dir(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "codec_config.json").write_text((GOLDEN / "codec_config.json").read_text())
    assert load_codec_config(model).num_codebooks == 4  # the parent's (golden layout)
    (model / "codec_config.json").write_text(json.dumps(S1_CODEC))
    assert load_codec_config(model).num_codebooks == 10  # beside codec.pth wins
