"""How the real `codec.pth` lays out the codec's tensors (S1 spec §7.1-7.2), for writing a checkpoint that
is read exactly like the real one.

The module holds plain weights; the file holds what upstream's training code saved:
- the convolutions of the encoder and the decoder with new-style weight norm
  (`X.parametrizations.weight.original0` = g [d0, 1, 1], `original1` = v), after their bias;
- the VQ projections (`quantizer.*.in_proj`, `out_proj`) with old-style weight norm (`X.weight_g`, `X.weight_v`),
  after their bias;
- each codec transformer's persistent buffers `freqs_cis` [block, d/2, 2] bf16 and `causal_mask`
  [block, block] bool, before its layers (the loader ignores them: `codec_buffer_key`).
`tests/model/test_checkpoint_writer.py` checks this against the tiny golden codec.pth key for key, in order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..codec.transformer import CodecTransformer
from ..layers import rope_table
from .weights import upstream_order

NEW_STYLE = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
OLD_STYLE = (".weight_g", ".weight_v")


def weight_norm_form(key: str) -> tuple[str, str] | None:
    """The on-disk (g, v) suffixes of a module key whose weight the real file stores weight-normed, else None."""
    if key.startswith(("encoder.", "decoder.")) and key.endswith(".conv.weight"):
        return NEW_STYLE
    if key.startswith("quantizer.") and key.endswith(("in_proj.weight", "out_proj.weight")):
        return OLD_STYLE
    return None


def split_weight_norm(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [d0, ...] -> (g [d0, 1, ...], v) with g * v / ||v|| = w (norm over every dim but 0, as fold_weight_norm)."""
    w = w.float()
    g = w.pow(2).sum(dim=tuple(range(1, w.dim())), keepdim=True).sqrt()
    return g, w


def transformer_buffers(codec: nn.Module) -> dict[str, dict[str, Tensor]]:
    """{prefix: {"freqs_cis": bf16 [block, d/2, 2], "causal_mask": bool [block, block]}} per codec transformer."""
    out = {}
    for name, module in codec.named_modules():
        if isinstance(module, CodecTransformer):
            cfg = module.cfg
            out[name] = {"freqs_cis": rope_table(cfg.block_size, cfg.head_dim, cfg.rope_base),
                         "causal_mask": torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril()}
    return out


def to_file_layout(codec: nn.Module) -> dict[str, Tensor]:
    """The codec's weights (on CPU, fp32) as the real codec.pth holds them, keys in the file's order."""
    buffers = transformer_buffers(codec)
    out: dict[str, Tensor] = {}
    pending: dict[str, Tensor] = {}  # weight-normed weights waiting for their bias (the file puts them after it)

    def flush(prefix: str | None = None) -> None:
        for key in [k for k in pending if prefix is None or k.rsplit(".", 1)[0] == prefix]:
            g_suffix, v_suffix = weight_norm_form(key)
            base = key[: -len(".weight")]
            out[base + g_suffix], out[base + v_suffix] = split_weight_norm(pending.pop(key))

    for key, value in codec.state_dict().items():
        value = value.detach().cpu().float().contiguous()
        owner = key.rsplit(".", 1)[0]
        for prefix, tensors in buffers.items():
            if key.startswith(prefix + ".") and prefix + ".freqs_cis" not in out:
                out.update({f"{prefix}.{name}": t for name, t in tensors.items()})
        if weight_norm_form(key):
            flush()
            pending[key] = value
            continue
        if pending and key != owner + ".bias":
            flush()
        out[key] = value
        if key.endswith(".bias"):
            flush(owner)
    flush()
    return upstream_order(out)

