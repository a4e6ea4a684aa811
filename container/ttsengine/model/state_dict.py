"""State dicts in the modules' own form: the name and weight forms of a checkpoint file turned into what the
modules hold (a family's key normalisation uses these). Tensors in, tensors out: no file is read here."""

from __future__ import annotations

import torch
from torch import Tensor

StateDict = dict[str, Tensor]


def strip_prefix(sd: StateDict, prefix: str) -> StateDict:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}


def fold_weight_norm(sd: StateDict) -> StateDict:
    """Replaces weight-norm pairs by the plain weight W = g * v / ||v|| (norm over all dims but 0).

    Both on-disk forms: `X.weight_g`/`X.weight_v` and `X.parametrizations.weight.original0/1`.
    For a ConvTranspose1d weight [in, out, k], dim 0 is the input channel, as torch's weight_norm uses.
    """
    out = dict(sd)
    forms = ((".weight_g", ".weight_v"), (".parametrizations.weight.original0", ".parametrizations.weight.original1"))
    for g_suffix, v_suffix in forms:
        for key in [k for k in sd if k.endswith(g_suffix)]:
            base = key[: -len(g_suffix)]
            if base + v_suffix not in sd:
                continue
            g, v = out.pop(key).float(), out.pop(base + v_suffix).float()
            norm = v.pow(2).sum(dim=tuple(range(1, v.dim())), keepdim=True).sqrt()
            out[base + ".weight"] = v * (g / norm)
    return out


def fuse_qkv(sd: StateDict) -> StateDict:
    """Older checkpoints store wq/wk/wv separately; the model reads one wqkv (rows q, k, v)."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith(".attention.wq.weight")]:
        base = key[: -len("wq.weight")]
        parts = [base + name + ".weight" for name in ("wq", "wk", "wv")]
        if all(p in out for p in parts):
            out[base + "wqkv.weight"] = torch.cat([out.pop(p) for p in parts], dim=0)
    return out
