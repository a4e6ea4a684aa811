"""Every config error path names the key and the file (or the env var)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import GOLDEN, MODEL_DIR, ROOT

from ttsengine.config import (
    ENV_VARS,
    PLACEMENT_FIELDS,
    TABLES,
    DownloadConfig,
    EngineConfig,
    RunPodConfig,
    SageMakerConfig,
    ServerConfig,
    from_env,
)
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
    speed = from_env({"TTS_FEATURES": "+codec_compile, -Snake_Kernel,lazy_graphs"})
    assert speed.features == "+codec_compile,-snake_kernel,+lazy_graphs"  # one spelling: lower case, +NAME
    assert EngineConfig().features == from_env({}).features == "auto"  # the registry's defaults
    assert from_env({"TTS_LOG_LEVEL": "debug", "TTS_DTYPE": "BFloat16"}).log_level == "DEBUG"


SWITCHES = [v for v in ENV_VARS.values() if v.kind.expected == "auto, on or off"]


def test_every_switch_takes_auto_on_off():
    names = {v.name for v in SWITCHES}
    # the speed features are a list (TTS_FEATURES), not switches
    assert names == {"TTS_ALLOW_SPECIAL_TOKENS", "TTS_STRICT_FIELDS", "TTS_PREFIX_CACHE", "TTS_TRACE_CHUNKS",
                     "TTS_ENGINE_PROCESS", "RUNPOD_AGGREGATE_STREAM"}
    for var in SWITCHES:
        for word in ("auto", "on", "off", "AUTO", "On", "1", "0", "true", "false", "yes", "no"):
            from_env({var.name: word})  # no error
            RunPodConfig.from_env({var.name: word})
    assert [RunPodConfig.from_env({"RUNPOD_AGGREGATE_STREAM": w}).aggregate_stream for w in ("auto", "off", "on")] \
        == [True, False, True]


@pytest.mark.parametrize("name, field, words", [
    # word: value; the words 1/0, true/false, yes/no are what the boolean switches took before
    ("TTS_ALLOW_SPECIAL_TOKENS", "allow_special_tokens", {"auto": False, "on": True, "true": True, "no": False}),
    ("TTS_PREFIX_CACHE", "prefix_cache", {"auto": True, "on": True, "off": False, "0": False}),
])
def test_switch_words(name, field, words):
    for word, value in words.items():
        assert getattr(from_env({name: word}), field) == value, word


@pytest.mark.parametrize("text, kept", [
    ("auto", "auto"), ("", "auto"), (" -cuda_graphs , +PDL ", "-cuda_graphs,+pdl"), ("layer_gemv", "+layer_gemv"),
    ("none,+merged_ffn", "none,+merged_ffn"), ("all,-fast_stack", "all,-fast_stack"), ("-kernels", "-kernels"),
])
def test_features_list_is_kept_in_one_spelling(text, kept):
    assert from_env({"TTS_FEATURES": text}).features == kept


@pytest.mark.parametrize("text, bad", [("+cuda_graph", "'+cuda_graph'"), ("-fused", "'-fused'"), ("+", "'+'"),
                                       ("++pdl", "'++pdl'"), ("on", "'on'"), ("+auto", "'+auto'")])
def test_an_unknown_feature_is_one_line_naming_the_valid_ones(text, bad):
    with pytest.raises(ConfigError, match=f"TTS_FEATURES: {re.escape(bad)} is not a feature: give auto, none, all, "
                                          "kernels or [+]NAME / -NAME of cuda_graphs, .*, layer_gemv, .*codec_cache$") \
            as e:
        from_env({"TTS_FEATURES": text})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("env, features", [
    ({"TTS_COMPILE": "off"}, "-compile"),
    ({"TTS_CUDA_GRAPHS": "on", "TTS_LAZY_GRAPHS": "0"}, "+cuda_graphs,-lazy_graphs"),
    ({"TTS_FUSED_KERNELS": "off"}, "-kernels"),
    ({"TTS_FUSED_KERNELS": "auto", "TTS_CODEC_MERGE": "auto"}, "auto"),
    ({"TTS_FUSED_KERNELS": "merged_ffn,layer_gemv"}, "-kernels,+merged_ffn,+layer_gemv"),
    ({"TTS_CUDNN_BENCHMARK": "on"}, "+cudnn_benchmark"),
    ({"TTS_CUDNN_BENCHMARK": "off"}, "-cudnn_tuning,-cudnn_benchmark"),
    ({"TTS_CODEC_COMPILE": "yes", "TTS_FEATURES": "-codec_compile"}, "+codec_compile,-codec_compile"),  # the new wins
])
def test_the_replaced_switches_still_read_with_a_warning(caplog, monkeypatch, env, features):
    import ttsengine.config

    monkeypatch.setattr(ttsengine.config, "_WARNED", set())  # a warning once a process: this test's own
    with caplog.at_level("WARNING", logger="ttsengine.config"):
        assert from_env(env).features == features
    old = [name for name in env if name != "TTS_FEATURES"]  # set, even to auto: each says to move
    assert [r.getMessage().split()[0] for r in caplog.records] == old
    assert all("replaced by TTS_FEATURES" in r.getMessage() for r in caplog.records)
    caplog.clear()
    assert from_env(env).features == features and not caplog.records  # said once


@pytest.mark.parametrize("env, pattern", [
    ({"TTS_COMPILE": "fast"}, r"TTS_COMPILE='fast': expected auto, on or off"),
    ({"TTS_FUSED_KERNELS": "merged_ffn,turbo"}, r"TTS_FUSED_KERNELS: 'turbo' not one of fast_attention, "),
])
def test_the_replaced_switches_refuse_what_they_refused(env, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_env(env)


def test_developer_settings_are_few():
    # the speed features' on/off switches are one list (TTS_FEATURES); what is left are sizes and test hooks
    assert sorted(n for n, v in ENV_VARS.items() if v.dev) == [
        "TTS_FEATURES", "TTS_FIRST_CHUNK_FRAMES", "TTS_INT8_KERNEL", "TTS_LAYER_GEMV_ROWS", "TTS_PREFILL_GROUP",
        "TTS_PREFILL_TOKENS", "TTS_STREAM_CHUNK_FRAMES", "TTS_TEST_FAIL_ENGINE", "TTS_TRACE_CHUNKS"]


@pytest.mark.parametrize("env, pattern", [
    ({"TTS_CHUNK_LENGTH": "abc"}, r"TTS_CHUNK_LENGTH='abc': expected an integer"),
    ({"TTS_CHUNK_LENGTH": "10"}, r"TTS_CHUNK_LENGTH: 10 is outside 50..1000"),
    ({"TTS_DEVICE": "tpu"}, r"TTS_DEVICE: 'tpu' is not one of"),
    ({"TTS_DTYPE": "int3"}, r"TTS_DTYPE: 'int3' is not one of"),
    ({"TTS_MAX_BATCH": "-1"}, r"TTS_MAX_BATCH: -1 is outside 0..4096 \(0 = auto\)"),
    ({"TTS_LAYER_GEMV_ROWS": "65"}, r"TTS_LAYER_GEMV_ROWS: 65 is outside 0..64 \(0 = auto\)"),
    ({"TTS_PREFILL_GROUP": "12"}, r"TTS_PREFILL_GROUP: 12 is not one of 8, 16, 32, 64"),
    ({"TTS_PREFILL_GROUP": "many"}, r"TTS_PREFILL_GROUP='many': expected one of 8, 16, 32, 64"),
    ({"TTS_MAX_REFERENCE_SECONDS": "0"}, r"TTS_MAX_REFERENCE_SECONDS: must be > 0"),
    ({"TTS_LOG_LEVEL": "LOUD"}, r"TTS_LOG_LEVEL: 'LOUD' is not one of DEBUG"),
    ({"TTS_ALLOW_SPECIAL_TOKENS": "maybe"}, r"TTS_ALLOW_SPECIAL_TOKENS='maybe': expected auto, on or off"),
    ({"TTS_PREFIX_CACHE": "later"}, r"TTS_PREFIX_CACHE='later': expected auto, on or off"),
    ({"TTS_QUANT": "int2"}, r"TTS_QUANT: 'int2' is not one of bf16, none, int8, int4"),
])
def test_engine_config_errors(env, pattern):
    with pytest.raises(ConfigError, match=pattern) as e:
        from_env(env)
    assert "\n" not in str(e.value)


def test_overrides_are_checked_like_the_environment():
    with pytest.raises(ConfigError, match="TTS_DEVICE: 'tpu'"):
        from_env({}, device="tpu")  # e.g. `synth --device tpu`
    with pytest.raises(ConfigError, match="TTS_FEATURES: 'snake' is not a feature"):
        from_env({}, features="snake")  # e.g. bench's --no-graphs adds to the list
    with pytest.raises(ConfigError, match="unknown EngineConfig setting"):
        from_env({}, bogus=1)


def test_layers_defaults_then_environment_then_overrides():
    """A platform's defaults (passed in by its adapter) yield to the environment; CLI overrides win."""
    assert from_env({}, defaults={"max_batch": 3}).max_batch == 3
    assert from_env({"TTS_MAX_BATCH": "5"}, defaults={"max_batch": 3}).max_batch == 5
    assert from_env({"TTS_MAX_BATCH": "5"}, defaults={"max_batch": 3}, max_batch=7).max_batch == 7
    assert from_env({"TTS_MAX_BATCH": "5"}, max_batch=None).max_batch == 5  # None: the flag was not given
    assert from_env({"TTS_MAX_BATCH": "  "}).max_batch == 0  # blank: unset
    assert ServerConfig.from_env({"TTS_API_KEY": ""}).api_key is None  # empty: unset (compose's ${VAR:-})
    with pytest.raises(ConfigError, match="TTS_API_KEY is blank"):  # a credential: blank is a mistake
        ServerConfig.from_env({"TTS_API_KEY": " \t"})


def test_server_configs():
    assert ServerConfig.from_env({}) == ServerConfig()
    cfg = ServerConfig.from_env({"TTS_PORT": "9000", "TTS_API_KEY": "k", "TTS_DATA_DIR": "/d",
                                 "TTS_MAX_BODY_BYTES": "4096"}, host="127.0.0.1")
    assert (cfg.host, cfg.port, cfg.api_key, str(cfg.data_dir), cfg.max_body_bytes) == ("127.0.0.1", 9000, "k", "/d",
                                                                                         4096)
    # SageMaker's serve: its port wins over TTS_PORT, its 1 GB body limit yields to TTS_MAX_BODY_BYTES
    sm = SageMakerConfig.from_env({"SAGEMAKER_BIND_TO_PORT": "8081"})
    served = ServerConfig.from_env({"TTS_PORT": "9000"}, defaults={"max_body_bytes": 1 << 30}, port=sm.port)
    assert (served.port, served.max_body_bytes) == (8081, 1 << 30)
    assert ServerConfig.from_env({}, port=SageMakerConfig.from_env({}).port).port == 8080
    assert ServerConfig.from_env({"TTS_MAX_BODY_BYTES": "2048"}, defaults={"max_body_bytes": 1 << 30}).max_body_bytes \
        == 2048
    assert DownloadConfig.from_env({"HF_TOKEN": "t", "TTS_MODEL_SOURCE": " hf://a/b "}) == \
        DownloadConfig("t", "hf://a/b")


@pytest.mark.parametrize("read, env, pattern", [
    (ServerConfig.from_env, {"TTS_PORT": "99999"}, r"TTS_PORT: 99999 is outside 1..65535"),
    (ServerConfig.from_env, {"TTS_PORT": "http"}, r"TTS_PORT='http': expected an integer"),
    (ServerConfig.from_env, {"TTS_MAX_UPLOAD_BYTES": "10"}, r"TTS_MAX_UPLOAD_BYTES: must be >= 1024"),
    (SageMakerConfig.from_env, {"SAGEMAKER_BIND_TO_PORT": "0"}, r"SAGEMAKER_BIND_TO_PORT: 0 is outside 1..65535"),
    (RunPodConfig.from_env, {"RUNPOD_CONCURRENCY": "-1"}, r"RUNPOD_CONCURRENCY: must be >= 0"),
    (RunPodConfig.from_env, {"RUNPOD_MAX_INLINE_BYTES": "5"}, r"RUNPOD_MAX_INLINE_BYTES: must be >= 1024"),
    (RunPodConfig.from_env, {"RUNPOD_S3_URL_EXPIRES": "0"}, r"RUNPOD_S3_URL_EXPIRES: must be >= 1"),
    (ServerConfig.from_env, {"TTS_DRAIN_SECONDS": "-1"}, r"TTS_DRAIN_SECONDS: -1 is outside 0..3600"),
    (ServerConfig.from_env, {"TTS_READ_TIMEOUT": "0"}, r"TTS_READ_TIMEOUT: must be > 0"),
    (ServerConfig.from_env, {"TTS_READ_TIMEOUT": "inf"}, r"TTS_READ_TIMEOUT: inf is not a finite number"),
    (ServerConfig.from_env, {"TTS_LIVE_IDLE_TIMEOUT": "nan"}, r"TTS_LIVE_IDLE_TIMEOUT: nan is not a finite number"),
    (ServerConfig.from_env, {"TTS_HEADER_TIMEOUT": "-1"}, r"TTS_HEADER_TIMEOUT: must be >= 0 \(0: no limit\)"),
    (ServerConfig.from_env, {"TTS_BODY_MIN_RATE": "inf"},
     r"TTS_BODY_MIN_RATE: inf is not a finite number \(give bytes per second, or 0 for no limit\)"),
    (from_env, {"TTS_MAX_REFERENCE_SECONDS": "inf"}, r"TTS_MAX_REFERENCE_SECONDS: inf is not a finite number"),
    (ServerConfig.from_env, {"TTS_API_KEY": "clé"}, r"TTS_API_KEY: contains 'é': use printable ASCII"),
    (ServerConfig.from_env, {"TTS_API_KEY": "a\tb"}, r"TTS_API_KEY: contains '\\t'"),
    (ServerConfig.from_env, {"TTS_DOWNLOAD_MAX_FILES": "0"}, r"TTS_DOWNLOAD_MAX_FILES: must be >= 1"),
    (from_env, {"TTS_MAX_BATCH": "100000"}, r"TTS_MAX_BATCH: 100000 is outside 0..4096"),
    (from_env, {"TTS_MAX_QUEUE": "99999999999"}, r"TTS_MAX_QUEUE: 99999999999 is outside 0..100000"),
    (from_env, {"TTS_KV_CACHE_TOKENS": "1e9"}, r"TTS_KV_CACHE_TOKENS='1e9': expected an integer"),
    (from_env, {"TTS_KV_CACHE_TOKENS": "999999999"}, r"TTS_KV_CACHE_TOKENS: 999999999 is outside 0..16777216"),
])
def test_other_config_errors(read, env, pattern):
    with pytest.raises(ConfigError, match=pattern):
        read(env)


def test_each_dataclass_is_described_by_its_table():
    for cls, table in zip((EngineConfig, ServerConfig, SageMakerConfig, RunPodConfig, DownloadConfig), TABLES):
        internal = PLACEMENT_FIELDS if cls is EngineConfig else set()
        assert {f.name for f in fields(cls)} == {v.field for v in table} | internal, cls.__name__
    names = [v.name for table in TABLES for v in table]
    shared = {n for n in names if names.count(n) > 1}
    # one Var in two tables each: stored voices, the SIGTERM drain, how requests are read and when work is taken
    # (settled), the chunk trace, for the servers and RunPod
    assert shared == {"TTS_DATA_DIR", "TTS_DRAIN_SECONDS", "TTS_VOICE_ALIASES", "TTS_STRICT_FIELDS",
                      "TTS_READY_WHEN", "TTS_READY_MAX_WAIT", "TTS_TRACE_CHUNKS"}
    for name in shared:
        assert len({id(v) for table in TABLES for v in table if v.name == name}) == 1


def test_platform_defaults_are_the_adapters():
    source = (ROOT / "container" / "ttsengine" / "config.py").read_text()
    assert "runpod-volume" not in source and "1 << 30" not in source


CONFIG_DOC = ROOT / "docs" / "configuration.md"  # the one list of variables (the README links to it)


def _doc_rows(section: str) -> list[str]:
    text = CONFIG_DOC.read_text().split(section + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\|\s*`([A-Z][A-Z0-9_]+)`\s*\|", text, flags=re.M)


def test_the_configuration_doc_lists_every_env_var_once():
    rows = _doc_rows("## Environment variables") + _doc_rows("## Developer settings")
    assert set(ENV_VARS) <= set(rows), f"docs/configuration.md lacks {sorted(set(ENV_VARS) - set(rows))}"
    assert not {n for n in rows if n.startswith("TTS_")} - set(ENV_VARS), "the doc lists TTS_ vars config.py lacks"
    assert sorted(n for n in rows if rows.count(n) > 1) == [], "a variable listed twice"
    dev = set(_doc_rows("## Developer settings"))
    assert dev == {n for n, v in ENV_VARS.items() if v.dev}, "the doc's developer table and config.py's dev=True"
    readme = (ROOT / "README.md").read_text()
    assert "docs/configuration.md#environment-variables" in readme
    assert not re.findall(r"^\|\s*`TTS_[A-Z0-9_]+`\s*\|", readme, flags=re.M), "variables are listed in one place"


def test_codec_config_lookup_prefers_the_model_dir(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "codec_config.json").write_text((GOLDEN / "codec_config.json").read_text())
    assert load_codec_config(model).num_codebooks == 4  # the parent's (golden layout)
    (model / "codec_config.json").write_text(json.dumps(S1_CODEC))
    assert load_codec_config(model).num_codebooks == 10  # beside codec.pth wins


def test_engine_config_takes_string_paths():
    # a Python caller's strings work like from_env's Paths (the engine calls Path methods on both)
    from ttsengine.config import EngineConfig

    cfg = EngineConfig(model_dir="models/x", cache_dir="/tmp/kc")
    assert cfg.model_dir == Path("models/x") and cfg.cache_dir == Path("/tmp/kc")
    assert EngineConfig(cache_dir=None).cache_dir is None and cfg.with_(cache_dir="b").cache_dir == Path("b")
