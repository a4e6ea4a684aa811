"""A random-weight checkpoint with the exact S1-mini shapes, for benchmarks without the real files.

Shapes from spec §2 (DualAR) and §7 (codec). The tokenizer is byte-level (256 ranks) plus S1's 15
control tokens and 4096 semantic tokens, so ids differ from the real vocabulary but every tensor
shape, including the 155,776-row vocabulary, is the real one.
"""

from __future__ import annotations

import torch

from . import families
from .checkpoint import Checkpoint
from .codec import Codec
from .codec.config import S1_CODEC, parse_codec_config
from .dual_ar import DualAR
from .dual_ar_config import parse_dual_ar_config
from .tokenizer import Tokenizer

S1_MINI_CONFIG = {
    "model_type": "dual_ar", "dim": 1024, "n_layer": 28, "n_head": 16, "n_local_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "vocab_size": 155776, "codebook_size": 4096, "num_codebooks": 10,
    "max_seq_len": 8192, "rope_base": 1_000_000.0, "norm_eps": 1e-6, "n_fast_layer": 4,
    "attention_qk_norm": True, "tie_word_embeddings": False,
}
CONTROL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>",
                  "<|phoneme_start|>", "<|phoneme_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|text|>",
                  "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio|>")
FAMILIES = {"s1-mini": S1_MINI_CONFIG}


def synthetic_tokenizer(semantic: int = 4096) -> Tokenizer:
    ranks = {bytes([i]): i for i in range(256)}
    return Tokenizer(ranks, [*CONTROL_TOKENS, *(f"<|semantic:{i}|>" for i in range(semantic))], name="synthetic")


def random_checkpoint(name: str, device: torch.device | str, dtype: torch.dtype, codec_dtype: torch.dtype,
                      seed: int = 0) -> Checkpoint:
    """Random S1-mini (`name` = "s1-mini"), initialised directly on `device`."""
    if name not in FAMILIES:
        raise ValueError(f"unknown synthetic model {name!r} (known: {', '.join(FAMILIES)})")
    torch.manual_seed(seed)
    cfg = parse_dual_ar_config(FAMILIES[name], source=f"synthetic {name}")
    codec_cfg = parse_codec_config(S1_CODEC, "built-in S1 codec config")
    tok = synthetic_tokenizer(cfg.codebook_size)
    with torch.device(device):
        model = DualAR(cfg, tok.semantic_begin_id, tok.semantic_end_id)
        for emb in (model.embeddings, model.codebook_embeddings, model.fast_embeddings):
            torch.nn.init.normal_(emb.weight)
        codec = Codec(codec_cfg)
    model = model.to(device=device, dtype=dtype).eval()
    model.init_buffers()
    codec = codec.to(device=device, dtype=codec_dtype).eval()
    return Checkpoint(model_dir=None, family=families.s1, config=cfg, codec_config=codec_cfg, tokenizer=tok,
                      model=model, codec=codec)
