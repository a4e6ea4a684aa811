"""copy_to: one engine's weights for the next device, every tensor copied (none shared, none left behind)."""

from __future__ import annotations

import torch
from torch import nn

from ttsengine.model.loading.replicate import copy_to


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("table", torch.arange(6.0))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.plain = torch.full((2,), 7.0)  # a tensor attribute, not registered
        self.tied = self.linear.weight  # the same parameter twice stays one tensor


def test_every_tensor_is_copied_equal_and_shared_ones_stay_shared():
    src = Holder()
    dst = copy_to(src, "cpu")
    x = torch.randn(5, 4)
    assert torch.equal(src.linear(x), dst.linear(x))
    pairs = [(src.linear.weight, dst.linear.weight), (src.linear.bias, dst.linear.bias), (src.table, dst.table),
             (src.scratch, dst.scratch), (src.plain, dst.plain)]
    for a, b in pairs:
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert isinstance(dst.linear.weight, nn.Parameter) and dst.tied is dst.linear.weight
    dst.table.zero_()
    assert src.table.sum() == 15  # nothing shared with the source


def test_a_golden_checkpoint_copy_runs_the_same(model_dir):
    from ttsengine.model.loading.checkpoint import load_checkpoint

    ckpt = load_checkpoint(model_dir)
    codec = copy_to(ckpt.codec, "cpu")
    codes = torch.randint(0, 8, (1, ckpt.codec_config.num_codebooks, 6))
    with torch.inference_mode():
        assert torch.equal(ckpt.codec.decode(codes), codec.decode(codes))
