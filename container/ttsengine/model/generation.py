"""Eager single-request generation: prefill, cached decode loop, stop rule (S1 spec §6.1).

This is the reference every fast path is tested against. It syncs with the host once per frame
(to check the stop token); the batched engine does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import InputError
from .dual_ar import DualAR
from .frame import sample_frame
from .layers import causal_mask_from_positions
from .sampling import RepetitionWindow, SamplingTensors


def frame_budget(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> int:
    """Frames to generate at most: the request's value (0 = fill the context), cut to what fits."""
    if prompt_len >= max_seq_len:
        raise InputError(f"prompt of {prompt_len} tokens does not fit the model's context of {max_seq_len}")
    budget = max_new_tokens or (max_seq_len - prompt_len)
    return min(budget, max_seq_len - prompt_len)


@dataclass
class Generation:
    """Iterates the kept frames [n+1] of one generation. Upstream drops the last generated frame
    unconditionally (it is the <|im_end|> frame when the model stopped), so each frame is released
    only once the next one exists. After exhaustion, `finish_reason` is "stop" or "length"."""

    frames: Iterator[Tensor]
    im_end_id: int
    finish_reason: str | None = None
    generated: int = 0

    def __iter__(self) -> Iterator[Tensor]:
        previous = None
        for frame in self.frames:
            self.generated += 1
            if previous is not None:
                yield previous
            previous = frame
        if previous is not None:
            self.finish_reason = "stop" if int(previous[0]) == self.im_end_id else "length"


def raw_frames(model: DualAR, prompt: Tensor, params: SamplingTensors, budget: int, im_end_id: int,
               penalty_window: int, frame_offset: int = 0) -> Iterator[Tensor]:
    """prompt: int64 [n+1, T] -> every generated frame [n+1] (on the model's device), the last included.

    frame_offset: frames this request generated before (long texts), so the random stream continues.
    """
    device = model.norm.weight.device
    n, T = model.cfg.num_codebooks, prompt.shape[1]
    length = min(model.cfg.cache_len, -(-(T + budget) // 8) * 8)
    caches = model.new_caches(1, length, model.norm.weight.dtype, device)
    index = torch.tensor([frame_offset], dtype=torch.int64, device=device)

    pos = torch.arange(T, device=device)[None]
    hidden = model.slow_forward(model.embed(prompt.to(device)[None]), pos, causal_mask_from_positions(pos, T),
                                caches, kv_len=T)[:, -1]
    frame = sample_frame(model, model.slow_head(hidden), hidden, params, index, window=None)
    yield frame[0]
    window = RepetitionWindow.empty(1, n + 1, penalty_window, device)
    for i in range(budget - 1):
        pos = torch.full((1, 1), T + i, dtype=torch.int64, device=device)
        hidden = model.slow_forward(model.embed(frame[:, :, None]), pos, causal_mask_from_positions(pos, T + i + 1),
                                    caches, kv_len=T + i + 1)[:, -1]
        frame = sample_frame(model, model.slow_head(hidden), hidden, params, index + i + 1, window)
        window.record(frame)
        yield frame[0]
        if int(frame[0, 0]) == im_end_id:  # stop after appending, never on the prefill frame
            return
