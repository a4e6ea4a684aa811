"""A random-weight checkpoint with the exact S1-mini config, for benchmarks without the real files.

`S1_MINI_CONFIG` is the real `config.json` of fishaudio/openaudio-s1-mini key for key (spec §2), so
every shape and every config-dependent code path (scaled codebook embeddings, fast heads of 64, q/k
norm in the slow layers only) is the real one. The tokenizer keeps the real id layout (spec §4.1):
151,643 ordinary ranks, the 15 control tokens at 151,643..151,657 and the 4,096 semantic tokens from
151,658; only the byte strings of the multi-byte ranks are made up. The codec uses the built-in S1
codec config (spec §7).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError
from .. import families
from ..codec import Codec, CodecConfig
from ..codec.config import S1_CODEC, parse_codec_config
from ..dual_ar import DualAR
from ..dual_ar_config import DualARConfig, parse_dual_ar_config
from ..tokenizer import Tokenizer
from .checkpoint import Checkpoint, check_consistency

S1_MINI_CONFIG: dict[str, Any] = {  # the real config.json, all keys (spec §2), in the file's order
    "attention_o_bias": False, "attention_qk_norm": True, "attention_qkv_bias": False, "codebook_size": 4096,
    "dim": 1024, "dropout": 0.0, "fast_attention_o_bias": False, "fast_attention_qk_norm": False,
    "fast_attention_qkv_bias": False, "fast_dim": 1024, "fast_head_dim": 64, "fast_intermediate_size": 3072,
    "fast_n_head": 16, "fast_n_local_heads": 8, "head_dim": 128, "initializer_range": 0.03125,
    "intermediate_size": 3072, "max_seq_len": 8192, "model_type": "dual_ar", "n_fast_layer": 4, "n_head": 16,
    "n_layer": 28, "n_local_heads": 8, "norm_eps": 1e-06, "num_codebooks": 10, "rope_base": 1000000,
    "scale_codebook_embeddings": True, "tie_word_embeddings": False, "use_gradient_checkpointing": True,
    "vocab_size": 155776,
}
BASE_VOCAB = 151_643  # ordinary BPE ranks of the real tokenizer.tiktoken (ids 0..151,642)
CONTROL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>",
                  "<|phoneme_start|>", "<|phoneme_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|text|>",
                  "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio|>")


@dataclass(frozen=True)
class PresetSpec:
    """What a preset is built from: config.json's keys, the codec config (codec_config.json's form) and
    how many ordinary BPE ranks its tokenizer has."""

    config: dict[str, Any]
    codec_config: dict[str, Any]
    base_vocab: int = BASE_VOCAB


FAMILIES = {"s1-mini": PresetSpec(S1_MINI_CONFIG, S1_CODEC)}
# the letters (and the space a word piece starts with) the made-up multi-byte ranks are spelled from
_ALPHABET = b" abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Preset:
    """Everything a random checkpoint is built from, without any weights (info reads this too)."""

    name: str
    raw_config: dict[str, Any]  # as config.json would hold it
    config: DualARConfig
    codec_config: CodecConfig
    tokenizer: Tokenizer
    raw_codec_config: dict[str, Any] | None = None  # as codec_config.json would hold it (None: built-in S1)
    base_vocab: int = BASE_VOCAB


def synthetic_ranks(n: int = BASE_VOCAB) -> dict[bytes, int]:
    """`n` byte-level BPE ranks: the 256 single bytes, then every 2-, 3-, 4-... letter string over
    `_ALPHABET` in a fixed order. Strings of different lengths, or different letters, never collide,
    and each is a concatenation of shorter ranks, so BPE merges text into them like a real
    vocabulary instead of leaving every byte alone. Cheap: the real count takes ~0.1 s."""
    ranks = {bytes([i]): i for i in range(256)}
    for length in itertools.count(2):
        for letters in itertools.product(_ALPHABET, repeat=length):
            if len(ranks) == n:
                return ranks
            ranks[bytes(letters)] = len(ranks)
    raise AssertionError("unreachable")


def synthetic_specials(semantic: int = 4096) -> list[str]:
    """special_tokens.json's entries in id order: CONTROL_TOKENS, then <|semantic:0..semantic-1|>."""
    return [*CONTROL_TOKENS, *(f"<|semantic:{i}|>" for i in range(semantic))]


def synthetic_tokenizer(semantic: int = 4096, base_vocab: int = BASE_VOCAB) -> Tokenizer:
    """Real id layout: `base_vocab` ranks, then CONTROL_TOKENS, then <|semantic:0..semantic-1|>."""
    return Tokenizer(synthetic_ranks(base_vocab), synthetic_specials(semantic), name="synthetic")


def load_preset(name: str) -> Preset:
    """The preset `name` (e.g. "s1-mini"), checked the way a model directory is."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown synthetic model {name!r} (known: {', '.join(FAMILIES)})")
    spec = FAMILIES[name]
    cfg = parse_dual_ar_config(spec.config, source=f"synthetic {name}")
    builtin = spec.codec_config is S1_CODEC
    codec_cfg = parse_codec_config(spec.codec_config, "built-in S1 codec config" if builtin else f"synthetic {name}")
    tok = synthetic_tokenizer(cfg.codebook_size, spec.base_vocab)
    check_consistency(cfg, tok, codec_cfg, Path(f"synthetic {name}"))
    return Preset(name, dict(spec.config), cfg, codec_cfg, tok, None if builtin else dict(spec.codec_config),
                  spec.base_vocab)


def init_weights(model: nn.Module, std: float) -> None:
    """Every linear and embedding weight ~ N(0, std), biases 0, norms keep their ones: the
    distribution upstream trains from (std = config's initializer_range), so activations and logits
    have realistic scales instead of the embeddings' default N(0, 1)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def random_checkpoint(name: str, device: torch.device | str, dtype: torch.dtype, codec_dtype: torch.dtype,
                      seed: int = 0, codec_device: torch.device | str | None = None) -> Checkpoint:
    """Random S1-mini (`name` = "s1-mini"), initialised directly on `device` (the codec on `codec_device`)."""
    codec_device = device if codec_device is None else codec_device
    preset = load_preset(name)
    cfg, tok = preset.config, preset.tokenizer
    torch.manual_seed(seed)
    with torch.device(device):  # the codec too: the same weights whichever device it then moves to
        model = DualAR(cfg, tok.semantic_begin_id, tok.semantic_end_id)
        init_weights(model, float(preset.raw_config.get("initializer_range", 0.02)))
        codec = Codec(preset.codec_config)  # the codec has no initializer_range: torch's default init
    model = model.to(device=device, dtype=dtype).eval()
    model.init_buffers()
    codec = codec.to(device=codec_device, dtype=codec_dtype).eval()
    return Checkpoint(model_dir=None, family=families.s1, config=cfg, codec_config=preset.codec_config,
                      tokenizer=tok, model=model, codec=codec)
