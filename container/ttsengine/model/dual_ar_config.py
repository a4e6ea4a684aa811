"""`config.json` of a DualAR checkpoint: read, validate, resolve upstream's fallbacks.

Upstream passes every key to a dataclass, so an unknown key is an error there too. Keys that decide
shapes or numerics are required here (upstream's defaults for them would silently build a different
model); training-only and `fast_*` keys take upstream's defaults and fallbacks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError

REQUIRED = (
    "model_type", "dim", "n_layer", "n_head", "n_local_heads", "head_dim", "intermediate_size",
    "vocab_size", "codebook_size", "num_codebooks", "max_seq_len", "rope_base", "norm_eps",
    "n_fast_layer",
)
# key -> upstream default, for keys a real file may omit.
OPTIONAL: dict[str, Any] = {
    "dropout": 0.0,
    "tie_word_embeddings": True,
    "attention_qkv_bias": False,
    "attention_o_bias": False,
    "attention_qk_norm": False,
    "use_gradient_checkpointing": True,
    "initializer_range": 0.02,
    "is_reward_model": False,
    "scale_codebook_embeddings": False,
    "fast_dim": None,
    "fast_n_head": None,
    "fast_n_local_heads": None,
    "fast_head_dim": None,
    "fast_intermediate_size": None,
    "fast_attention_qkv_bias": None,
    "fast_attention_qk_norm": None,
    "fast_attention_o_bias": None,
}
_INT_KEYS = {
    "dim", "n_layer", "n_head", "n_local_heads", "head_dim", "intermediate_size", "vocab_size",
    "codebook_size", "num_codebooks", "max_seq_len", "n_fast_layer", "fast_dim", "fast_n_head",
    "fast_n_local_heads", "fast_head_dim", "fast_intermediate_size",
}
_FLOAT_KEYS = {"rope_base", "norm_eps", "dropout", "initializer_range"}


@dataclass(frozen=True)
class TransformerShape:
    """The numbers one stack of blocks (slow or fast) is built from."""

    n_layer: int
    dim: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    rope_base: float
    norm_eps: float


@dataclass(frozen=True)
class DualARConfig:
    model_type: str
    vocab_size: int
    dim: int
    codebook_size: int
    num_codebooks: int
    max_seq_len: int
    tie_word_embeddings: bool
    scale_codebook_embeddings: bool
    slow: TransformerShape
    fast: TransformerShape

    @property
    def cache_len(self) -> int:
        """KV-cache length: max_seq_len rounded up to a multiple of 8, as upstream allocates it."""
        return int(math.ceil(self.max_seq_len / 8) * 8)


def load_dual_ar_config(path: Path) -> DualARConfig:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return parse_dual_ar_config(raw, source=str(path))


def parse_dual_ar_config(raw: Any, source: str = "config.json") -> DualARConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{source}: missing required key(s) {', '.join(map(repr, missing))}")
    v = {**OPTIONAL, **raw}
    for key, value in v.items():
        _check_type(key, value, source)
    if v["model_type"] != "dual_ar":
        raise ConfigError(f"{source}: key 'model_type' is {v['model_type']!r}; only 'dual_ar' (S1) is supported")
    if v["is_reward_model"]:
        raise ConfigError(f"{source}: key 'is_reward_model' is true; reward models cannot synthesize speech")

    n_local = v["n_head"] if v["n_local_heads"] == -1 else v["n_local_heads"]
    slow = TransformerShape(
        n_layer=v["n_layer"], dim=v["dim"], n_head=v["n_head"], n_local_heads=n_local,
        head_dim=v["head_dim"], intermediate_size=v["intermediate_size"],
        qkv_bias=v["attention_qkv_bias"], o_bias=v["attention_o_bias"], qk_norm=v["attention_qk_norm"],
        rope_base=float(v["rope_base"]), norm_eps=float(v["norm_eps"]),
    )

    def flag(name: str) -> bool:  # only null falls back for the fast flags
        return v["fast_" + name] if v["fast_" + name] is not None else v[name]

    fast = TransformerShape(  # falsy values fall back for the fast sizes, like upstream ("x or slow_x")
        n_layer=v["n_fast_layer"], dim=v["fast_dim"] or slow.dim, n_head=v["fast_n_head"] or slow.n_head,
        n_local_heads=v["fast_n_local_heads"] or slow.n_local_heads,
        head_dim=v["fast_head_dim"] or slow.head_dim,
        intermediate_size=v["fast_intermediate_size"] or slow.intermediate_size,
        qkv_bias=flag("attention_qkv_bias"), o_bias=flag("attention_o_bias"), qk_norm=flag("attention_qk_norm"),
        rope_base=slow.rope_base, norm_eps=slow.norm_eps,
    )
    cfg = DualARConfig(
        model_type="dual_ar", vocab_size=v["vocab_size"], dim=v["dim"], codebook_size=v["codebook_size"],
        num_codebooks=v["num_codebooks"], max_seq_len=v["max_seq_len"],
        tie_word_embeddings=v["tie_word_embeddings"], scale_codebook_embeddings=v["scale_codebook_embeddings"],
        slow=slow, fast=fast,
    )
    _check_shapes(cfg, source)
    return cfg


def _check_type(key: str, value: Any, source: str) -> None:
    if key == "model_type":
        ok = isinstance(value, str)
    elif key in _INT_KEYS:
        ok = (value is None and key.startswith("fast_")) or (isinstance(value, int) and not isinstance(value, bool))
    elif key in _FLOAT_KEYS:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # flags
        ok = isinstance(value, bool) or (value is None and key.startswith("fast_"))
    if not ok:
        raise ConfigError(f"{source}: key {key!r} has an invalid value {value!r}")


def _check_shapes(cfg: DualARConfig, source: str) -> None:
    def fail(key: str, why: str) -> None:
        raise ConfigError(f"{source}: key {key!r}: {why}")

    for key in ("vocab_size", "dim", "codebook_size", "num_codebooks", "max_seq_len"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    for prefix, shape in (("", cfg.slow), ("fast_", cfg.fast)):
        for f in fields(shape):
            value = getattr(shape, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                name = "n_fast_layer" if (prefix and f.name == "n_layer") else prefix + f.name
                fail(name, f"must be >= 1, got {value}")
        if shape.n_head % shape.n_local_heads:
            fail(prefix + "n_head", f"{shape.n_head} is not divisible by {prefix}n_local_heads={shape.n_local_heads}")
        if shape.head_dim % 2:
            fail(prefix + "head_dim", f"must be even for rotary embeddings, got {shape.head_dim}")
        if shape.rope_base <= 0 or shape.norm_eps <= 0:
            fail("rope_base" if shape.rope_base <= 0 else "norm_eps", "must be > 0")
    if cfg.max_seq_len < 16:
        fail("max_seq_len", f"{cfg.max_seq_len} is too short to hold a prompt")
