"""The runner's prefill is padded to a few shapes (rows 1-8, positions 64..2048) so each can be a CUDA graph:
the padding must change no value and write nowhere but the scratch page."""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine import EngineConfig
from ttsengine.engine.loader import load
from ttsengine.engine.runner import PrefillItem, Runner, RunnerConfig


@pytest.fixture(scope="module")
def model():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu", dtype="float32")).model


def _runner(model) -> Runner:
    return Runner(model, RunnerConfig(max_slots=12, page_size=16, num_pages=120, penalty_window=4,
                                      triton_attention=False))


def _item(model, slot: int, length: int, seed: int) -> PrefillItem:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.cfg.codebook_size, (model.cfg.num_codebooks + 1, length), generator=g)
    return PrefillItem(slot, prompt, (0.8, 0.8, 1.1, seed), 0)


def test_prefill_keys(model):
    r = _runner(model)
    cap = model.cfg.cache_len
    assert r.prefill_key(1, 45) == (1, min(64, cap))
    assert r.prefill_key(3, 64) == (4, min(64, cap))
    assert r.prefill_key(5, 65) == (8, min(128, cap))
    assert r.prefill_key(2, cap) == (2, cap)  # never past the RoPE table
    keys = r.prefill_graph_keys()  # the shapes that get graphs: the small ones, none over 8,192 positions
    assert r.prefill_key(1, 1) in keys and all(rows * t <= 8192 for rows, t in keys)


def test_padding_changes_no_value_and_writes_only_scratch(model):
    # 10 prompts of different lengths in one padded call (with prefill graphs: groups of 8 and 2), against
    # each prompt prefilled alone at its exact length through the same layers
    items = [_item(model, slot, length, slot) for slot, length in enumerate([30, 5, 17, 44, 2, 9, 33, 21, 40, 12])]
    padded = _runner(model)
    with torch.inference_mode():
        padded.prefill(items)
        for it in items:
            exact = _runner(model)
            exact.ensure_pages([(it.slot, it.prompt.shape[1] - 1)])
            n = it.prompt.shape[1] - 1
            table = exact.page_table[it.slot:it.slot + 1]
            exact.prefill_layers(it.prompt[None, :, :-1], torch.tensor([n]), table)
            for layer, (a, b) in enumerate(zip(padded.kv, exact.kv)):
                for page in exact.slot_pages[it.slot]:
                    mine = padded.slot_pages[it.slot][exact.slot_pages[it.slot].index(page)]
                    for x, y in ((a.k, b.k), (a.v, b.v)):
                        assert torch.allclose(x[mine], y[page], atol=1e-5), (it.slot, layer)
    used = {0} | {p for pages in padded.slot_pages for p in pages}
    untouched = [p for p in range(120) if p not in used]
    for kv in padded.kv:
        assert not kv.k[untouched].any() and not kv.v[untouched].any()
    assert padded.pos[:10].tolist() == [it.prompt.shape[1] - 1 for it in items]
