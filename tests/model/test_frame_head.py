"""The fast head reads only the weight rows it samples from (frame.linear_rows)."""

from __future__ import annotations

import torch
from torch import nn

from ttsengine.model.frame import linear_rows
from ttsengine.model.quant import Int8Linear


def test_linear_rows_equals_the_full_layer_cut():
    torch.manual_seed(0)
    for bias in (False, True):
        lin = nn.Linear(32, 48, bias=bias)
        x = torch.randn(3, 1, 32)
        got = linear_rows(lin, x, 16)
        assert got.shape == (3, 1, 16) and torch.allclose(got, lin(x)[..., :16], atol=1e-6)
        assert torch.equal(linear_rows(lin, x, 48), lin(x))  # all rows: the layer itself


def test_linear_rows_cuts_layers_it_cannot_slice():
    torch.manual_seed(1)
    q = Int8Linear(nn.Linear(32, 48, bias=False), kernel="dequant")
    x = torch.randn(2, 1, 32)
    assert torch.equal(linear_rows(q, x, 16), q(x)[..., :16])
