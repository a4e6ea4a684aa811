"""The `s1-mini` preset behind `--random-weights s1-mini`: the real config.json key for key, the real
parameter counts, and a tokenizer with the real id layout. Everything big is built on the meta device."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from ttsengine.errors import ConfigError
from ttsengine.model.codec import Codec
from ttsengine.model.dual_ar import DualAR
from ttsengine.model.loading.synthetic import (
    BASE_VOCAB,
    S1_MINI_CONFIG,
    init_weights,
    load_preset,
    random_checkpoint,
    synthetic_ranks,
    synthetic_tokenizer,
)

# fishaudio/openaudio-s1-mini's config.json, all 30 keys (spec §2)
REAL_CONFIG = {
    "attention_o_bias": False, "attention_qk_norm": True, "attention_qkv_bias": False, "codebook_size": 4096,
    "dim": 1024, "dropout": 0.0, "fast_attention_o_bias": False, "fast_attention_qk_norm": False,
    "fast_attention_qkv_bias": False, "fast_dim": 1024, "fast_head_dim": 64, "fast_intermediate_size": 3072,
    "fast_n_head": 16, "fast_n_local_heads": 8, "head_dim": 128, "initializer_range": 0.03125,
    "intermediate_size": 3072, "max_seq_len": 8192, "model_type": "dual_ar", "n_fast_layer": 4, "n_head": 16,
    "n_layer": 28, "n_local_heads": 8, "norm_eps": 1e-06, "num_codebooks": 10, "rope_base": 1000000,
    "scale_codebook_embeddings": True, "tie_word_embeddings": False, "use_gradient_checkpointing": True,
    "vocab_size": 155776,
}
DUAL_AR_PARAMS = 860_169_216  # spec §2, measured on upstream with the real config
# spec §7 counts 391,430,530 with weight norm stored as (g, v); loading folds each g [d0, 1, 1] into
# its weight, so the module holds 32,145 fewer: encoder 8,768 + VQ in/out projections 10,320 + decoder 13,057
CODEC_PARAMS = 391_398_385


@pytest.fixture(scope="module")
def preset():
    return load_preset("s1-mini")


@pytest.fixture(scope="module")
def meta_modules(preset):
    with torch.device("meta"):
        return (DualAR(preset.config, preset.tokenizer.semantic_begin_id, preset.tokenizer.semantic_end_id),
                Codec(preset.codec_config))


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_preset_is_the_real_config_key_for_key(preset):
    assert S1_MINI_CONFIG == REAL_CONFIG
    assert type(S1_MINI_CONFIG["rope_base"]) is type(REAL_CONFIG["rope_base"])  # int in the file
    cfg = preset.config
    assert cfg.scale_codebook_embeddings and not cfg.tie_word_embeddings
    assert (cfg.slow.head_dim, cfg.fast.head_dim) == (128, 64)
    assert cfg.slow.qk_norm and not cfg.fast.qk_norm
    assert (cfg.fast.n_head, cfg.fast.n_local_heads, cfg.fast.dim, cfg.fast.intermediate_size) == (16, 8, 1024, 3072)


def test_dual_ar_and_codec_parameter_counts(meta_modules):
    dual_ar, codec = meta_modules
    assert _count(dual_ar) == DUAL_AR_PARAMS
    assert _count(codec) == CODEC_PARAMS
    # spec §2's breakdown: one slow layer, one fast layer (no q/k norm there), the tables
    assert _count(dual_ar.layers[0]) == 15_730_944 and _count(dual_ar.fast_layers[0]) == 12_584_960
    assert dual_ar.embeddings.weight.shape == dual_ar.output.weight.shape == (155_776, 1024)
    assert dual_ar.codebook_embeddings.weight.shape == (40_960, 1024)
    assert dual_ar.fast_layers[0].attention.wqkv.weight.shape == (2048, 1024)
    assert dual_ar.fast_layers[0].attention.wo.weight.shape == (1024, 1024)


def test_random_checkpoint_builds_the_preset(preset):
    ck = random_checkpoint("s1-mini", "meta", torch.bfloat16, torch.bfloat16)  # meta: no 3.4 GB on CPU
    assert ck.config == preset.config and ck.tokenizer.n_vocab == preset.tokenizer.n_vocab
    assert _count(ck.model) == DUAL_AR_PARAMS and _count(ck.codec) == CODEC_PARAMS
    assert ck.model.output.weight.dtype == torch.bfloat16
    assert (ck.model.semantic_begin_id, ck.model.semantic_end_id) == (151_658, 155_753)
    assert ck.model.rope_fast.shape == (10, 32, 2)  # fast_head_dim 64 -> 32 rotated pairs
    with pytest.raises(ConfigError, match="unknown synthetic model 's9'"):
        random_checkpoint("s9", "meta", torch.bfloat16, torch.bfloat16)


def test_init_weights_uses_the_configured_std():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(512, 256), nn.Linear(256, 512))
    init_weights(m, 0.03125)
    for w in (m[0].weight, m[1].weight):
        assert abs(w.std().item() - 0.03125) < 0.001 and abs(w.mean().item()) < 0.001
    assert not m[1].bias.any()


def test_tokenizer_has_the_real_id_layout(preset):
    tok = preset.tokenizer
    assert tok.specials["<|begin_of_text|>"] == BASE_VOCAB == 151_643
    assert tok.specials["<|pad|>"] == 151_645 and tok.specials["<|im_start|>"] == 151_646
    assert tok.im_end_id == 151_647 and tok.interleave_id == 151_654 and tok.specials["<|audio|>"] == 151_657
    assert (tok.semantic_begin_id, tok.semantic_end_id, tok.num_semantic) == (151_658, 155_753, 4096)
    assert len(tok.specials) == 4_111 and tok.n_vocab == 155_754 <= preset.config.vocab_size
    assert preset.config.vocab_size - tok.n_vocab == 22  # the real file pads the table to 155,776 rows
    assert tok.encode("<|semantic:0|><|semantic:4095|><|im_end|>") == [151_658, 155_753, 151_647]


def test_ranks_are_distinct_byte_level_bpe():
    ranks = synthetic_ranks()
    assert len(ranks) == BASE_VOCAB and sorted(ranks.values()) == list(range(BASE_VOCAB))
    assert all(ranks[bytes([b])] == b for b in range(256))
    assert all(len(k) > 1 for k, v in ranks.items() if v >= 256)


def test_tokenizer_is_cheap_and_round_trips():
    start = time.perf_counter()
    tok = synthetic_tokenizer()
    assert time.perf_counter() - start < 2.0  # ~0.3 s measured
    for text in ("Hello world, this is a test. Numbers: 42!", "héllo 你好 — emoji 🎉\nnew line\t tab",
                 "<|speaker:0|>plain text, <|interleave|> a special", "  leading spaces", ""):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    ids = tok.encode("the quick brown fox jumps over the lazy dog")
    assert any(256 <= i < BASE_VOCAB for i in ids) and len(ids) < 20  # merged into multi-byte ranks
    assert all(i < BASE_VOCAB for i in tok.encode("<|im_end|>", allow_special=False))


def test_empty_modules_are_the_same_without_filling_or_compiling_anything(preset, meta_modules):
    # checkpoint.on_meta skips nn.init's fills on meta tensors: their reference decomposition imported torch._dynamo
    # on first use, ~1 s of every load (stop 58). Same parameters, names, shapes and dtypes; nothing compiled.
    import subprocess
    import sys

    from ttsengine.model.loading.checkpoint import on_meta

    with on_meta():
        dual_ar, codec = (DualAR(preset.config, preset.tokenizer.semantic_begin_id, preset.tokenizer.semantic_end_id),
                          Codec(preset.codec_config))
    for got, want in ((dual_ar, meta_modules[0]), (codec, meta_modules[1])):
        shapes = lambda m: {k: (v.shape, v.dtype, v.is_meta) for k, v in m.state_dict().items()}  # noqa: E731
        assert shapes(got) == shapes(want)
    code = ("import sys, torch\n"
            "if 'torch._dynamo' in sys.modules: print('torch imports it'); sys.exit(0)\n"
            "from ttsengine.model.loading.synthetic import load_preset\n"
            "from ttsengine.model.loading.checkpoint import on_meta\n"
            "from ttsengine.model.dual_ar import DualAR\n"
            "from ttsengine.model.codec import Codec\n"
            "p = load_preset('s1-mini')\n"
            "with on_meta():\n"
            "    DualAR(p.config, p.tokenizer.semantic_begin_id, p.tokenizer.semantic_end_id), Codec(p.codec_config)\n"
            "print('dynamo' if 'torch._dynamo' in sys.modules else 'none')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip() == "torch imports it":
        pytest.skip("this torch imports torch._dynamo itself")
    assert out.stdout.strip() == "none", out.stdout
