"""Codec hyperparameters: `codec_config.json` beside `codec.pth` when present, else S1's built-in values.

The JSON uses upstream's `modded_dac_vq.yaml` keys (class-path keys such as `_target_` are ignored);
`quantizer.module` may describe both `pre_module` and `post_module`, or each may be given.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError


@dataclass(frozen=True)
class CodecTransformerConfig:
    n_layer: int
    n_head: int
    dim: int
    intermediate_size: int
    head_dim: int
    rope_base: float
    norm_eps: float
    window: int
    block_size: int  # upstream's RoPE-table length; longer inputs still work here (see transformer.py)


@dataclass(frozen=True)
class CodecConfig:
    sample_rate: int
    encoder_dim: int
    latent_dim: int
    encoder_rates: tuple[int, ...]
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    encoder_transformer_layers: tuple[int, ...]
    encoder_block_size: int
    head_dim: int
    rope_base: float
    norm_eps: float
    n_codebooks: int  # residual codebooks
    codebook_size: int
    codebook_dim: int
    semantic_codebook_size: int
    downsample_factor: tuple[int, ...]
    pre_module: CodecTransformerConfig
    post_module: CodecTransformerConfig

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def frame_length(self) -> int:
        """Samples per code frame (2048 for S1)."""
        return self.hop_length * math.prod(self.downsample_factor)

    @property
    def num_codebooks(self) -> int:
        return 1 + self.n_codebooks


ENCODER_WINDOW = 512  # hard-coded upstream for the encoder's transformer

_S1_MODULE = {"causal": True, "window_size": 128, "input_dim": 1024, "config": {
    "block_size": 4096, "n_layer": 8, "n_head": 16, "dim": 1024, "intermediate_size": 3072, "n_local_heads": -1,
    "head_dim": 64, "rope_base": 10000, "norm_eps": 1e-5}}
S1_CODEC: dict[str, Any] = {
    "sample_rate": 44100, "encoder_dim": 64, "latent_dim": 1024, "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1536, "decoder_rates": [8, 8, 4, 2], "encoder_transformer_layers": [0, 0, 0, 4],
    "decoder_transformer_layers": [4, 0, 0, 0],
    "transformer_general_config": {"block_size": 16384, "n_local_heads": -1, "head_dim": 64, "rope_base": 10000,
                                   "norm_eps": 1e-5},
    "quantizer": {"input_dim": 1024, "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
                  "downsample_factor": [2, 2], "semantic_codebook_size": 4096,
                  "pre_module": _S1_MODULE, "post_module": _S1_MODULE},
}

_TOP = {"sample_rate", "encoder_dim", "latent_dim", "encoder_rates", "decoder_dim", "decoder_rates",
        "encoder_transformer_layers", "decoder_transformer_layers", "transformer_general_config", "quantizer",
        "causal"}
_GENERAL = {"block_size", "n_layer", "n_head", "dim", "intermediate_size", "n_local_heads", "head_dim", "rope_base",
            "norm_eps", "dropout_rate", "attn_dropout_rate", "channels_first", "pos_embed_type",
            "max_relative_position"}
_QUANT = {"input_dim", "n_codebooks", "codebook_size", "codebook_dim", "quantizer_dropout", "downsample_factor",
          "downsample_dims", "semantic_codebook_size", "module", "pre_module", "post_module",
          "semantic_predictor_module"}
_MODULE = {"causal", "window_size", "input_dim", "config", "look_ahead_conv"}


def find_codec_config(model_dir: Path) -> Path | None:
    """`codec_config.json` beside codec.pth, else in the model directory's parent (the layout of the
    golden test sets, whose checkpoint/ folder sits beside their codec_config.json)."""
    for path in (Path(model_dir) / "codec_config.json", Path(model_dir).resolve().parent / "codec_config.json"):
        if path.is_file():
            return path
    return None


def load_codec_config(model_dir: Path) -> CodecConfig:
    path = find_codec_config(model_dir)
    if path is None:
        return parse_codec_config(S1_CODEC, "built-in S1 codec config")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return parse_codec_config(raw, str(path))


def _section(raw: Any, allowed: set[str], where: str, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where or 'top level'} must be a JSON object")
    unknown = sorted(k for k in raw if k not in allowed and not k.startswith("_"))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(repr(where + k) for k in unknown)}")
    return raw


def _get(d: dict[str, Any], key: str, where: str, source: str, kind: str = "int", default: Any = None) -> Any:
    if key not in d:
        if default is not None:
            return default
        raise ConfigError(f"{source}: missing key {where + key!r}")
    v = d[key]
    if kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    elif kind == "float":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    else:  # list of positive ints
        ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        v = tuple(v) if ok else v
    if not ok:
        raise ConfigError(f"{source}: key {where + key!r} has an invalid value {d[key]!r}")
    return v


def _module(raw: Any, where: str, source: str) -> CodecTransformerConfig:
    m = _section(raw, _MODULE, where, source)
    if m.get("causal", True) is not True:
        raise ConfigError(f"{source}: key {where + 'causal'!r}: only causal codec transformers are supported")
    c = _section(m.get("config"), _GENERAL, where + "config.", source)
    w = where + "config."
    dim, n_head, head_dim = _get(c, "dim", w, source), _get(c, "n_head", w, source), _get(c, "head_dim", w, source)
    if m.get("input_dim", dim) != dim:
        raise ConfigError(f"{source}: key {where + 'input_dim'!r} differs from {w + 'dim'!r}; "
                          "input/output projections are not supported")
    if c.get("n_local_heads", -1) not in (-1, n_head):
        raise ConfigError(f"{source}: key {w + 'n_local_heads'!r}: codec attention must have one KV head per head")
    if c.get("pos_embed_type", "rope") != "rope":
        raise ConfigError(f"{source}: key {w + 'pos_embed_type'!r}: only 'rope' is supported")
    if head_dim % 2:
        raise ConfigError(f"{source}: key {w + 'head_dim'!r} must be even, got {head_dim}")
    return CodecTransformerConfig(
        n_layer=_get(c, "n_layer", w, source), n_head=n_head, dim=dim,
        intermediate_size=_get(c, "intermediate_size", w, source), head_dim=head_dim,
        rope_base=float(_get(c, "rope_base", w, source, "float")),
        norm_eps=float(_get(c, "norm_eps", w, source, "float")),
        window=_get(m, "window_size", where, source), block_size=_get(c, "block_size", w, source),
    )


def parse_codec_config(raw: Any, source: str) -> CodecConfig:
    top = _section(raw, _TOP, "", source)
    if top.get("causal", True) is not True:
        raise ConfigError(f"{source}: key 'causal': only the causal codec is supported")
    g = _section(top.get("transformer_general_config", {}), _GENERAL, "transformer_general_config.", source)
    q = _section(top.get("quantizer"), _QUANT, "quantizer.", source)
    pre = q.get("pre_module", q.get("module"))
    post = q.get("post_module", q.get("module"))
    if pre is None or post is None:
        raise ConfigError(f"{source}: missing key 'quantizer.module' (or 'quantizer.pre_module'/'post_module')")

    encoder_dim = _get(top, "encoder_dim", "", source)
    encoder_rates = _get(top, "encoder_rates", "", source, "list")
    decoder_rates = _get(top, "decoder_rates", "", source, "list")
    cfg = CodecConfig(
        sample_rate=_get(top, "sample_rate", "", source),
        encoder_dim=encoder_dim,
        latent_dim=_get(top, "latent_dim", "", source, default=encoder_dim * 2 ** len(encoder_rates)),
        encoder_rates=encoder_rates,
        decoder_dim=_get(top, "decoder_dim", "", source),
        decoder_rates=decoder_rates,
        encoder_transformer_layers=_get(top, "encoder_transformer_layers", "", source, "list",
                                        default=(0,) * len(encoder_rates)),
        encoder_block_size=_get(g, "block_size", "transformer_general_config.", source),
        head_dim=_get(g, "head_dim", "transformer_general_config.", source),
        rope_base=float(_get(g, "rope_base", "transformer_general_config.", source, "float")),
        norm_eps=float(_get(g, "norm_eps", "transformer_general_config.", source, "float")),
        n_codebooks=_get(q, "n_codebooks", "quantizer.", source),
        codebook_size=_get(q, "codebook_size", "quantizer.", source),
        codebook_dim=_get(q, "codebook_dim", "quantizer.", source),
        semantic_codebook_size=_get(q, "semantic_codebook_size", "quantizer.", source),
        downsample_factor=_get(q, "downsample_factor", "quantizer.", source, "list"),
        pre_module=_module(pre, "quantizer.pre_module.", source),
        post_module=_module(post, "quantizer.post_module.", source),
    )
    if len(cfg.encoder_transformer_layers) != len(encoder_rates):
        raise ConfigError(f"{source}: key 'encoder_transformer_layers' needs one entry per encoder rate")
    if 0 in encoder_rates or 0 in decoder_rates or 0 in cfg.downsample_factor:
        raise ConfigError(f"{source}: rates and downsample factors must be >= 1")
    if cfg.decoder_dim % 2 ** len(decoder_rates):
        raise ConfigError(f"{source}: key 'decoder_dim' must be divisible by 2^{len(decoder_rates)}")
    if math.prod(decoder_rates) != cfg.hop_length:
        raise ConfigError(f"{source}: decoder_rates multiply to {math.prod(decoder_rates)}, "
                          f"encoder_rates to {cfg.hop_length}; they must agree")
    if q.get("input_dim", cfg.latent_dim) != cfg.latent_dim or cfg.pre_module.dim != cfg.latent_dim:
        raise ConfigError(f"{source}: quantizer input_dim and module dim must equal latent_dim={cfg.latent_dim}")
    enc_out = encoder_dim * 2 ** len(encoder_rates)
    if any(cfg.encoder_transformer_layers) and enc_out % cfg.head_dim:
        raise ConfigError(f"{source}: encoder width {enc_out} is not divisible by head_dim {cfg.head_dim}")
    return cfg
