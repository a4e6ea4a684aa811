"""The fast layers as one stack (TTS_FEATURES=+fast_stack): their weights on a leading layer axis, run at one
codebook position by one persistent kernel (model/kernels/fast_stack.py) at one or two rows.

`stack_fast_layers` copies each kind of weight of the fast layers into one [NL, ...] tensor and makes the modules'
own weights views of it (no extra memory, the modules compute as before), as FeedForward.merge_inputs does for
W1|W3. It needs what layer_gemv needs (fused_layer.layer_supported: merged W1|W3, bias-free bf16/fp16/fp32 or int8
linears of one kind) and, for the kernel's tiles, power-of-two head sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .fused_layer import layer_supported, linear_weight, merged_ffn_weight
from .kernels.fast_stack import MAX_ROWS, FastStackWeights, fast_stack

__all__ = ["MAX_ROWS", "kernel_runs", "make_fast_stack", "stack_fast_layers"]


def kernel_runs(device: torch.device) -> bool:
    """Whether the persistent kernel runs on `device`: CUDA with Triton, or anywhere under Triton's interpreter."""
    from .kernels import small_linear
    from .kernels.triton_support import triton_available

    return triton_available() and (device.type == "cuda" or small_linear._interpreted())


def stack_fast_layers(model: nn.Module) -> FastStackWeights | None:
    """-> the stacked weights, the fast layers' modules now reading views of them; None (nothing changed) where
    the layers do not fit the kernel."""
    layers = list(model.fast_layers)
    if not layers or not all(layer_supported(layer) for layer in layers):
        return None
    att = layers[0].attention
    d, H, Hk = att.head_dim, att.n_head, att.n_local_heads
    if d & (d - 1) or H % Hk:
        return None
    lin = {name: [linear_weight(layer.get_submodule(name)) for layer in layers] for name in ("attention.wqkv",
                                                                                         "attention.wo",
                                                                                         "feed_forward.w2")}
    w13 = [merged_ffn_weight(layer.feed_forward) for layer in layers]
    kinds = {w.dtype for pairs in (*lin.values(), w13) for w, _ in pairs}
    int8 = kinds == {torch.int8}
    if len(kinds) != 1 or (not int8 and any(s is not None for pairs in lin.values() for _, s in pairs)):
        return None
    qn = att.q_norm is not None
    if any((layer.attention.q_norm is not None) != qn for layer in layers):
        return None

    def linear(name: str) -> tuple[Tensor, Tensor | None]:
        mods = [layer.get_submodule(name) for layer in layers]
        if int8:
            w = _restack([m.weight_int8 for m in mods], [_setter(m, "weight_int8") for m in mods])
            return w, _restack([m.scale for m in mods], [_setter(m, "scale") for m in mods])
        return _restack([m.weight for m in mods], [_data_setter(m.weight) for m in mods]), None

    wqkv, wqkv_s = linear("attention.wqkv")
    wo, wo_s = linear("attention.wo")
    w2, w2_s = linear("feed_forward.w2")
    ffs = [layer.feed_forward for layer in layers]
    if int8:
        w13_w = _restack([ff.w13_int8 for ff in ffs], [_merged_setter(ff, "w13_int8", "weight_int8") for ff in ffs])
        w13_s = _restack([ff.w13_scale for ff in ffs], [_merged_setter(ff, "w13_scale", "scale") for ff in ffs])
    else:
        w13_w = _restack([ff.w13 for ff in ffs], [_merged_setter(ff, "w13", None) for ff in ffs])
        w13_s = None
    norms = {name: _restack([layer.get_submodule(name).weight for layer in layers],
                            [_data_setter(layer.get_submodule(name).weight) for layer in layers])
             for name in ("attention_norm", "ffn_norm", *(("attention.q_norm", "attention.k_norm") if qn else ()))}
    return FastStackWeights(
        wqkv=wqkv, wo=wo, w13=w13_w, w2=w2, attention_norm=norms["attention_norm"], ffn_norm=norms["ffn_norm"],
        q_norm=norms.get("attention.q_norm"), k_norm=norms.get("attention.k_norm"), wqkv_scale=wqkv_s,
        wo_scale=wo_s, w13_scale=w13_s, w2_scale=w2_s, n_head=H, n_local_heads=Hk, head_dim=d,
        eps=layers[0].attention_norm.eps, qk_eps=att.q_norm.eps if qn else 0.0,
        sync=torch.zeros(2, dtype=torch.int32, device=wqkv.device))


def make_fast_stack(weights: FastStackWeights) -> Callable:
    """-> fn(x [B, 1, D], rope [B, d/2, 2], k_cache, v_cache [NL, B, Hk, L, d], pos: int) -> [B, 1, D]: every fast
    layer at position `pos` (frame.FrameOps.fast_stack)."""

    def run(x: Tensor, rope: Tensor, k_cache: Tensor, v_cache: Tensor, pos: int) -> Tensor:
        return fast_stack(x[:, 0], weights, k_cache, v_cache, rope, pos)[:, None]

    return run


def _restack(tensors: list[Tensor], setters: list[Callable[[Tensor], None]]) -> Tensor:
    # one [NL, ...] copy of the tensors; each owner then holds its view of it (the old storage is freed)
    stacked = torch.stack([t.detach() for t in tensors]).contiguous()
    for i, set_view in enumerate(setters):
        set_view(stacked[i])
    return stacked


def _data_setter(param: Tensor) -> Callable[[Tensor], None]:
    def set_view(view: Tensor) -> None:
        param.data = view

    return set_view


def _setter(module: nn.Module, buffer: str) -> Callable[[Tensor], None]:
    def set_view(view: Tensor) -> None:
        setattr(module, buffer, view)

    return set_view


def _merged_setter(ff: nn.Module, buffer: str, part: str | None) -> Callable[[Tensor], None]:
    # the merged W1|W3 buffer (or its int8 scale), and W1's and W3's halves as views of it (merge_inputs' layout)
    def set_view(view: Tensor) -> None:
        setattr(ff, buffer, view)
        h = view.shape[0] // 2
        if part is None:
            ff.w1.weight.data, ff.w3.weight.data = view[:h], view[h:]
        else:
            setattr(ff.w1, part, view[:h])
            setattr(ff.w3, part, view[h:])

    return set_view
