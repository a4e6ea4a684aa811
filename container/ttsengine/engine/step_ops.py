"""The units a decode step is made of, eager or torch.compile'd.

Compiling per unit instead of the whole step keeps cold compiles short: every slow layer shares one
graph (regional compilation: the layer module is an argument, its weights graph inputs), every fast
position shares one, and sampling has two (slow vocabulary, codebook). The batch dimension is
dynamic from 2 up (size 1 always specialises, so compiled buckets start at 2). CUDA graphs then
capture the whole step, so the Python between units costs nothing at replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model.frame import FrameOps, fast_layer_step, fast_logits, sample_token


def make_slow_layer(attend: Callable, use_triton: bool) -> Callable:
    def slow_layer(layer: nn.Module, x: Tensor, rope: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor,
                   pos: Tensor) -> Tensor:
        # x: [B, 1, D]; rope: [B, 1, d/2, 2]; writes this position's key/value into the paged pools
        att = layer.attention
        q, k, v = att.project(layer.attention_norm(x), rope)
        y = attend(q[:, 0], k[:, 0], v[:, 0], k_pool, v_pool, table, pos, use_triton)
        x = x + att.wo(y.reshape(x.shape[0], 1, -1))
        return x + layer.feed_forward(layer.ffn_norm(x))

    return slow_layer


class Compiled:
    """torch.compile'd `fn` whose arguments at `batch_args` have a dynamic dim 0 in [2, max_batch]."""

    def __init__(self, fn: Callable, batch_args: tuple[int, ...], max_batch: int):
        self.fn = torch.compile(fn, dynamic=None)
        self.batch_args, self.max_batch = batch_args, max(max_batch, 3)

    def __call__(self, *args):
        from torch import _dynamo

        for i in self.batch_args:
            if isinstance(args[i], Tensor):
                _dynamo.mark_dynamic(args[i], 0, min=2, max=self.max_batch)
        return self.fn(*args)


@dataclass(frozen=True)
class StepOps:
    slow_layer: Callable
    frame: FrameOps

    @staticmethod
    def eager(attend: Callable, use_triton: bool) -> StepOps:
        return StepOps(make_slow_layer(attend, use_triton), FrameOps())

    @staticmethod
    def compiled(attend: Callable, use_triton: bool, max_batch: int) -> StepOps:
        frame = FrameOps(sample=Compiled(sample_token, (0, 1, 2, 3, 4, 5, 6, 7), max_batch),
                         fast_layer=Compiled(fast_layer_step, (1, 2, 3, 4, 5, 6), max_batch),
                         fast_head=Compiled(fast_logits, (1,), max_batch))
        return StepOps(Compiled(make_slow_layer(attend, use_triton), (1, 2, 5, 6), max_batch), frame)
