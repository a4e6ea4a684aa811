"""Everything specific to the OpenAudio S1 checkpoint family (fishaudio/openaudio-s1-mini).

A second family (e.g. S2) gets a module beside this one with the members of `Family` (family.py) and a place in
the registry (__init__.py); nothing here needs to change for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from ..dual_ar_config import DualARConfig, load_dual_ar_config
from ..prompt import CodesPart, TextPart, assemble
from ..state_dict import StateDict, fold_weight_norm, fuse_qkv, strip_prefix
from ..tokenizer import IM_END, INTERLEAVE, Tokenizer
from .family import GenerationRules

NAME = "s1"
SPEAKER = "<|speaker:0|>"  # plain text in S1's tokenizer, BPE-encoded like any other text
MODEL_FILES = ("model.pth", "model.safetensors")
CODEC_FILES = ("codec.pth", "codec.safetensors")
REQUIRED_FILES = ("config.json", "tokenizer.tiktoken", "special_tokens.json")


# how S1 generates (spec §6); the ranges and defaults are those of upstream's HTTP request model
RULES = GenerationRules(penalty_window=16, prompt_reserve=2048, temperature_range=(0.1, 1.0), top_p_range=(0.1, 1.0),
                        repetition_penalty_range=(0.9, 2.0), default_temperature=0.8, default_top_p=0.8,
                        default_repetition_penalty=1.1, default_max_new_tokens=1024)


def matches(model_dir: Path) -> bool:
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("model_type") == "dual_ar"


def load_config(model_dir: Path) -> DualARConfig:
    return load_dual_ar_config(Path(model_dir) / "config.json")


def load_tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.load(model_dir)


def normalize_model_keys(sd: StateDict) -> StateDict:
    # Upstream: a `model.`-prefixed file loses the prefix; `audio_*` entries (training-time
    # heads) are dropped; separate wq/wk/wv are fused.
    if next(iter(sd)).startswith("model."):
        sd = strip_prefix(sd, "model.")
    return fuse_qkv({k: v for k, v in sd.items() if "audio_" not in k})


def normalize_codec_keys(sd: StateDict) -> StateDict:
    # A training checkpoint holds generator + discriminator: keep the generator.
    if any(k.startswith("generator.") for k in sd):
        sd = strip_prefix({k: v for k, v in sd.items() if k.startswith("generator.")}, "generator.")
    elif all(k.startswith("model.") for k in sd):
        sd = strip_prefix(sd, "model.")
    return fold_weight_norm(sd)


def build_prompt(tokenizer: Tokenizer, num_codebooks: int, text: str,
                 references: list[tuple[str, Tensor]], allow_special: bool) -> Tensor:
    """S1 layout (spec §5): <|interleave|>, then per reference: speaker tag, its text, its codes,
    <|im_end|>; then speaker tag and the text. No system prompt, no assistant prefix.

    references: (text, codes [n, F]) pairs; a previous chunk of a long text is passed the same way.
    -> int64 [n+1, T]
    """
    parts = _prefix_parts(references, allow_special) + [TextPart(SPEAKER), TextPart(text, allow_special)]
    return assemble(parts, tokenizer, num_codebooks)


def build_prefix(tokenizer: Tokenizer, num_codebooks: int, references: list[tuple[str, Tensor]],
                 allow_special: bool) -> Tensor:
    """The first columns of every build_prompt with these references, whatever the text (each part is tokenized
    on its own): the prefix requests with the same voice share (engine/control/prefix_cache.py). -> int64 [n+1, P]"""
    return assemble(_prefix_parts(references, allow_special), tokenizer, num_codebooks)


def _prefix_parts(references: list[tuple[str, Tensor]], allow_special: bool) -> list[TextPart | CodesPart]:
    parts: list[TextPart | CodesPart] = [TextPart(INTERLEAVE)]
    for ref_text, codes in references:
        parts += [TextPart(SPEAKER), TextPart(ref_text, allow_special), CodesPart(codes), TextPart(IM_END)]
    return parts
