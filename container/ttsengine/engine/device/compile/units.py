"""The units a decode step is made of, eager or torch.compile'd.

Compiling per unit instead of the whole step keeps cold compiles short: every slow layer shares one
graph (regional compilation: the layer module is an argument, its weights graph inputs), every fast
position shares one, and sampling has two (slow vocabulary, codebook). The batch dimension is
dynamic from 2 up (size 1 always specialises: the 1-row bucket is a variant of its own). CUDA graphs then
capture the whole step, so the Python between units costs nothing at replay. With a `store`
directory each unit is precompiled instead (engine/device/compile/precompiled.py): a warm start loads its trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ....compat import compiler
from ....model.frame import FrameOps, fast_layer_step, fast_logits, sample_token, sample_token_blocked
from ....model.kernels.codebook_sampler import sample_codebook_embed
from ....model.kernels.vocab_sampler import sample_vocab_triton
from ....model.layers import swiglu
from ...features import CODEBOOK_SAMPLER, FAST_ATTENTION, VOCAB_SAMPLER, VOCAB_SCAN


def make_slow_layer(attend: Callable, use_triton: bool) -> Callable:
    def slow_layer(layer: nn.Module, x: Tensor, rope: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor,
                   pos: Tensor) -> Tensor:
        # x: [B, 1, D]; rope: [B, 1, d/2, 2]; writes this position's key/value into the paged pools
        att = layer.attention
        q, k, v = att.project(layer.attention_norm(x), rope)
        y = attend(q[:, 0], k[:, 0], v[:, 0], k_pool, v_pool, table, pos, use_triton)
        x = x + att.wo(y.reshape(x.shape[0], 1, -1))
        return x + swiglu(layer.feed_forward, layer.ffn_norm(x))

    return slow_layer


def frame_ops(attend: Callable, use_triton: bool, fused: frozenset[str], wrap: Callable | None = None) -> FrameOps:
    """The frame's ops with the `fused` kernels in place; wrap(fn, name, batch_args) compiles a unit (None:
    eager). The codebook sampler is a Triton kernel itself: never traced."""
    wrap = wrap or (lambda fn, name, batch_args: fn)
    # fast_attention: the fast layer is the slow layer's function (one Triton kernel for the cache write +
    # GQA attention on CUDA instead of scatter, repeat, mask and SDPA) over a cache seen as a paged pool
    fast_layer = (wrap(make_slow_layer(attend, use_triton), "fast_layer_paged", (1, 2, 5, 6))
                  if FAST_ATTENTION in fused else wrap(fast_layer_step, "fast_layer", (1, 2, 3, 4, 5, 6)))
    sample = (wrap(sample_token_blocked, "sample_blocked", (0, 1, 2, 3, 4, 5, 6, 7)) if VOCAB_SCAN in fused
              else wrap(sample_token, "sample", (0, 1, 2, 3, 4, 5, 6, 7)))
    # the codebooks: their kernel, else the reference (never the vocab sampler: five launches and a 256 KB histogram
    # for 1,024 logits)
    fused_codebook = CODEBOOK_SAMPLER in fused
    codebook_reference = sample
    if VOCAB_SAMPLER in fused:
        sample = SixteenBit(sample_vocab_triton, sample)
    return FrameOps(sample=sample, fast_layer=fast_layer,
                    fast_head=wrap(fast_logits, "fast_head", (1,)),
                    sample_codebook=None if fused_codebook else codebook_reference,
                    sample_embed=sample_codebook_embed if fused_codebook else None,
                    paged_fast=FAST_ATTENTION in fused)


@dataclass(frozen=True)
class SixteenBit:
    """The slow token's sampler: `kernel` (the sort-free vocab sampler, kernels/vocab_sampler.py) for bf16 / fp16
    logits, `fallback` (the sorted reference, compiled or not) for fp32 ones, which its histogram cannot count."""

    kernel: Callable
    fallback: Callable

    def __call__(self, logits: Tensor, *rest) -> Tensor:
        if logits.dtype in (torch.bfloat16, torch.float16):
            return self.kernel(logits, *rest)
        return self.fallback(logits, *rest)


def dynamic_batch(t) -> bool:
    """Whether batch argument `t` gets a dynamic dim 0 (Compiled, Precompiled: the range starts at 2). A batch of one
    (a single request's prefill sample, a one-slot engine) compiles as its own static graph: marking a size-1 dim
    dynamic fails Dynamo's constraints, and the whole compile with it."""
    return isinstance(t, Tensor) and t.shape[0] >= 2


class Compiled:
    """torch.compile'd `fn` whose arguments at `batch_args` have a dynamic dim 0 in [2, max_batch]. torch.compile is
    called at the first call: it imports torch._dynamo (~1 s), which a start then pays only once a unit runs."""

    def __init__(self, fn: Callable, batch_args: tuple[int, ...], max_batch: int):
        self.source, self.fn = fn, None
        self.batch_args, self.max_batch = batch_args, max(max_batch, 3)

    def __call__(self, *args):
        if self.fn is None:
            compiler()  # the import, the recompile limit and what the kernel cache deferred to the first compile
            self.fn = torch.compile(self.source, dynamic=None)
        from torch import _dynamo

        for i in self.batch_args:
            if dynamic_batch(args[i]):
                _dynamo.mark_dynamic(args[i], 0, min=2, max=self.max_batch)
        return self.fn(*args)


@dataclass(frozen=True)
class StepOps:
    slow_layer: Callable
    frame: FrameOps

    def precompiled(self) -> dict[str, int] | None:
        """Precompiled variants loaded from disk and traced by this process (None: not precompiling)."""
        sample = self.frame.sample
        sample = sample.fallback if isinstance(sample, SixteenBit) else sample
        units = [u for u in (self.slow_layer, sample, self.frame.fast_layer, self.frame.fast_head)
                 if hasattr(u, "loaded")]
        if not units:
            return None
        return {"loaded": sum(u.loaded for u in units), "compiled": sum(u.compiled for u in units)}

    @staticmethod
    def eager(attend: Callable, use_triton: bool, fused: frozenset[str] = frozenset()) -> StepOps:
        return StepOps(make_slow_layer(attend, use_triton), frame_ops(attend, use_triton, fused))

    @staticmethod
    def compiled(attend: Callable, use_triton: bool, max_batch: int, store: Path | None = None,
                 fused: frozenset[str] = frozenset()) -> StepOps:
        """`store`: directory of precompiled units (None: plain torch.compile units)."""

        def unit(fn: Callable, name: str, batch_args: tuple[int, ...]) -> Callable:
            def plain() -> Compiled:
                return Compiled(fn, batch_args, max_batch)

            if store is None:
                return plain()
            from .precompiled import Precompiled

            return Precompiled(fn, name, batch_args, max_batch, store, plain)

        return StepOps(unit(make_slow_layer(attend, use_triton), "slow_layer", (1, 2, 5, 6)),
                       frame_ops(attend, use_triton, fused, unit))
