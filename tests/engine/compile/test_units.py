"""The compiled decode-step units' dynamic batch: a batch of one (a single request's prefill sample, a one-slot
engine) compiles as its own static graph instead of failing Dynamo's constraints (it used to take the whole compile
down: "serving without compile" at TTS_MAX_BATCH=1); larger batches share the dynamic graph."""

from __future__ import annotations

import pytest
import torch

from ttsengine.compat import compile_supported
from ttsengine.engine.device.compile.units import Compiled, dynamic_batch

pytestmark = pytest.mark.skipif(not compile_supported(), reason="torch.compile is used from torch 2.6 on")


def scaled_softmax(x, y):
    return (x.softmax(-1) * y[:, None]).sum(-1)


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_batch_of_one_compiles(max_batch):
    unit = Compiled(scaled_softmax, (0, 1), max_batch)
    for b in (1, 2, 3, 4)[:max_batch if max_batch > 1 else 1]:
        x, y = torch.randn(b, 8), torch.randn(b)
        torch.testing.assert_close(unit(x, y), scaled_softmax(x, y))


def test_only_batches_of_two_or_more_are_marked():
    assert dynamic_batch(torch.zeros(2, 3)) and not dynamic_batch(torch.zeros(1, 3)) and not dynamic_batch(None)
