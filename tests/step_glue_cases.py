"""Inputs for the step glue kernels' tests (tests/model/test_step_glue.py on CPU, tests/engine/test_gpu_fused.py on
the GPU): rows' last frames and a decode step's end state."""

from __future__ import annotations

import torch

from ttsengine.model.sampling import RepetitionWindow


def last_frames(m, B: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' last frames: semantic tokens, the first and last semantic ids, and text tokens around them."""
    g = torch.Generator().manual_seed(seed)
    n, cb = m.cfg.num_codebooks, m.cfg.codebook_size
    frames = torch.randint(0, cb, (B, n + 1), generator=g)
    begin, end = m.semantic_begin_id, m.semantic_end_id
    tokens = [begin, end, begin - 1, end + 1, 3] + torch.randint(begin, end + 1, (B,), generator=g).tolist()
    frames[:, 0] = torch.tensor(tokens[:B])
    pos = torch.randint(0, m.rope_slow.shape[0], (B,), generator=g)
    return frames, pos



def step_state(B: int, n1: int, W: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    frame = torch.randint(0, 5000, (B, n1), generator=g)
    active = torch.rand(B, generator=g) < 0.7
    fresh = torch.rand(B, generator=g) < 0.3
    active[:4] = torch.tensor([True, True, False, False])
    fresh[:4] = torch.tensor([True, False, True, False])
    big = B + 3  # the runner's buffers are views of the first B rows of larger ones
    state = torch.randint(0, 5000, (big, n1), generator=g)
    out = torch.randint(0, 5000, (big, n1), generator=g)
    pos = torch.randint(0, 100, (big,), generator=g)
    index = torch.randint(0, 100, (big,), generator=g)
    window = RepetitionWindow(torch.randint(0, 5000, (big, n1, W), generator=g),
                              torch.randint(0, 3 * W, (big,), generator=g))  # counts below and past the ring
    return frame, active, fresh, state, out, pos, index, window
