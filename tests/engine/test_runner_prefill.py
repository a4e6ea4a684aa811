"""The runner's prefill is padded to a few shapes (rows 1-8, positions 64..2048, history pages) so each can be a
CUDA graph: the padding must change no value and write nowhere but the scratch page. A prefill with history (a
later chunk of a long prompt, a prefix-cache hit starting past the shared pages) must write the same cache and
arm the same first frame as the whole prompt prefilled at once."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import MODEL_DIR

from ttsengine import EngineConfig
from ttsengine.engine.control.page_pool import PagePool
from ttsengine.engine.device.runner import PrefillItem, Runner, RunnerConfig
from ttsengine.engine.loader import load


@pytest.fixture(scope="module")
def model():
    return load(EngineConfig(model_dir=MODEL_DIR, device="cpu", dtype="float32")).model


def _runner(model, **kw) -> Runner:
    return Runner(model, RunnerConfig(max_slots=12, page_size=16, num_pages=120, penalty_window=4,
                                      triton_attention=False, **kw))


class Paged:
    """A runner with the control plane's page pool beside it, allocating for each prefill as the scheduler does
    (control/scheduler.py schedule): through each item's last position, the armed ones' first decode position."""

    def __init__(self, model, **kw):
        self.runner = _runner(model, **kw)
        self.pool = PagePool(120, 12, 16)

    def prefill(self, items: list[PrefillItem]) -> None:
        for it in items:
            if it.last or it.stop > it.start:
                self.pool.grow(it.slot, it.stop if it.last else it.stop - 1)
        self.runner.prefill([replace(it, pages=tuple(self.pool.slot_pages[it.slot])) for it in items])


def _item(model, slot: int, length: int, seed: int) -> PrefillItem:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.cfg.codebook_size, (model.cfg.num_codebooks + 1, length), generator=g)
    return PrefillItem(slot, prompt, (0.8, 0.8, 1.1, seed), 0)


def test_prefill_keys(model):
    r = _runner(model)
    cap = model.cfg.cache_len
    assert r.prefill_key(1, 45) == (1, min(64, cap), 0)
    assert r.prefill_key(3, 64) == (4, min(64, cap), 0)
    assert r.prefill_key(5, 65) == (8, min(128, cap), 0)
    assert r.prefill_key(2, cap) == (2, cap, 0)  # never past the RoPE table
    # with history: the pages gathered (page 16 here), padded to 2, 8, 32, ... and never past a row's table
    assert r.prefill_key(1, 30, 17) == (1, 64, 2) and r.prefill_key(1, 30, 33) == (1, 64, 8)
    assert r.prefill_key(2, 30, cap) == (2, 64, r.max_pages_per_seq)
    keys = r.prefill_graph_keys()  # the shapes that get graphs: the small ones, none over 8,192 positions
    assert r.prefill_key(1, 1) in keys and all(rows * t <= 8192 for rows, t, _ in keys)
    history = [k for k in keys if k[2]]  # short parts with history; gathered keys bounded
    assert r.prefill_key(1, 30, 17) in history and all(t <= 128 and rows * p * 16 <= 16384 for rows, t, p in history)


def test_padding_changes_no_value_and_writes_only_scratch(model):
    # 10 prompts of different lengths in one padded call (with prefill graphs: groups of 8 and 2), against
    # each prompt prefilled alone at its exact length through the same layers
    items = [_item(model, slot, length, slot) for slot, length in enumerate([30, 5, 17, 44, 2, 9, 33, 21, 40, 12])]
    padded = Paged(model)
    with torch.inference_mode():
        padded.prefill(items)
        for it in items:
            exact = Paged(model)
            exact.pool.grow(it.slot, it.prompt.shape[1] - 1)
            n = it.prompt.shape[1] - 1
            held = exact.pool.slot_pages[it.slot]
            table = exact.runner.host_table([tuple(held)], exact.runner.max_pages_per_seq)
            exact.runner.prefill_layers(it.prompt[None, :, :-1], torch.tensor([n]), table)
            for layer, (a, b) in enumerate(zip(padded.runner.kv, exact.runner.kv)):
                for page in held:
                    mine = padded.pool.slot_pages[it.slot][held.index(page)]
                    for x, y in ((a.k, b.k), (a.v, b.v)):
                        assert torch.allclose(x[mine], y[page], atol=1e-5), (it.slot, layer)
    used = {0} | {p for pages in padded.pool.slot_pages for p in pages}
    untouched = [p for p in range(120) if p not in used]
    for kv in padded.runner.kv:
        assert not kv.k[untouched].any() and not kv.v[untouched].any()
    assert padded.runner.pos[:10].tolist() == [it.prompt.shape[1] - 1 for it in items]


def _frames_after_step(p: Paged, slots: list[int]) -> torch.Tensor:
    return p.runner.decode_step(max(slots) + 1)[slots].clone()


def _positions(p: Paged, slot: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of the slot's positions [0, n) -> [(k, v) [Hk, n, d]]."""
    table = p.runner.host_table([tuple(p.pool.slot_pages[slot])], -(-n // p.runner.cfg.page_size))
    return [tuple(t[0, :, :n] for t in kv.gather(table)) for kv in p.runner.kv]


def test_chunks_and_a_shared_prefix_write_the_cache_and_arm_the_frame_of_the_whole_prompt(model):
    whole_item = _item(model, 0, 150, 5)
    n = 149  # positions prefill writes
    with torch.inference_mode():
        whole = Paged(model)
        whole.prefill([whole_item])
        want_kv, want_frame = _positions(whole, 0, n), _frames_after_step(whole, [0])

        chunked = Paged(model)  # uneven chunks, one of a single position, the last one arms
        for a, b in ((0, 40), (40, 41), (41, 100), (100, n)):
            chunked.prefill([PrefillItem(0, whole_item.prompt, whole_item.params, 0, a, b)])
            # until armed, the decode step sees an all-scratch row (it computes the slot as idle); then its pages
            assert bool(chunked.runner.page_table[0].any()) == (b == n)
        assert chunked.runner.page_table[0, :10].tolist() == chunked.pool.slot_pages[0]

        shared = Paged(model)  # slot 1 reads slot 0's first 3 pages (48 positions) through the prefix cache's path
        shared.prefill([whole_item])
        pages = shared.pool.keep(0, 3)
        shared.pool.release(0)  # the cache's reference keeps them
        shared.runner.reset_slots([0])
        assert all(shared.pool.refs[p] == 1 for p in pages) and not set(pages) & set(shared.pool.free)
        shared.pool.share(1, pages)
        shared.prefill([PrefillItem(1, whole_item.prompt, whole_item.params, 0, 48)])
        assert shared.pool.slot_pages[1][:3] == pages and all(shared.pool.refs[p] == 2 for p in pages)
        for r, slot in ((chunked, 0), (shared, 1)):
            for (k, v), (wk, wv) in zip(_positions(r, slot, n), want_kv):
                assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)
        assert torch.equal(_frames_after_step(chunked, [0]), want_frame)
        assert torch.equal(_frames_after_step(shared, [1]), want_frame)


def test_history_groups_pad_harmlessly(model):
    # 10 later parts with different starts and lengths in one call (groups of 8 and 2, padded rows and
    # positions, gathered pages padded to the key) == each part alone; nothing but scratch is written besides
    lengths = [30, 5, 17, 44, 2, 9, 33, 21, 40, 12]
    starts = [3, 1, 16, 20, 0, 7, 32, 5, 1, 11]
    items = [_item(model, slot, length + start + 1, slot) for slot, (length, start) in enumerate(zip(lengths, starts))]
    with torch.inference_mode():
        together, alone = Paged(model), Paged(model)
        together.prefill([PrefillItem(it.slot, it.prompt, it.params, 0, 0, s) for it, s in zip(items, starts) if s])
        together.prefill([PrefillItem(it.slot, it.prompt, it.params, 0, s) for it, s in zip(items, starts)])
        for it, s in zip(items, starts):
            if s:
                alone.prefill([PrefillItem(it.slot, it.prompt, it.params, 0, 0, s)])
            alone.prefill([PrefillItem(it.slot, it.prompt, it.params, 0, s)])
            n = it.prompt.shape[1] - 1
            for (k, v), (wk, wv) in zip(_positions(together, it.slot, n), _positions(alone, it.slot, n)):
                assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5), it.slot
        assert torch.equal(_frames_after_step(together, list(range(10))), _frames_after_step(alone, list(range(10))))
    used = {0} | {p for pages in together.pool.slot_pages for p in pages}
    untouched = [p for p in range(120) if p not in used]
    for kv in together.runner.kv:
        assert not kv.k[untouched].any() and not kv.v[untouched].any()


def test_a_larger_prefill_group_pads_to_its_rows_and_plans_their_graphs(model):
    # TTS_PREFILL_GROUP: the rows one prefill call is padded to go up to the group (8 by default), and the graph keys
    # follow, still none over 8,192 positions (32 rows: 64-256 positions; 64 rows: 64 and 128)
    r8, r32 = _runner(model), _runner(model, prefill_group=32)
    assert r8.prefill_rows == (1, 2, 4, 8) and r32.prefill_rows == (1, 2, 4, 8, 16, 32)
    assert r8.prefill_key(9, 45)[0] == 9 and r32.prefill_key(9, 45)[0] == 16  # 9 prompts: past 8 unpadded
    keys8, keys32 = set(r8.prefill_graph_keys()), set(r32.prefill_graph_keys())
    assert keys8 < keys32 and max(k[0] for k in keys8) == 8 and max(k[0] for k in keys32) == 32
    assert all(rows * t <= 8192 for rows, t, _ in keys32)


def test_a_prefill_without_the_pages_of_its_positions_is_refused(model):
    # the pages are the control plane's: an item that comes without them would write its keys to the scratch page
    r = _runner(model)
    with torch.inference_mode(), pytest.raises(ValueError, match="prefill of slot 0 up to position 29 got 1 pages"):
        r.prefill([replace(_item(model, 0, 30, 1), pages=(3,))])  # 30 positions need 2 pages of 16
    with torch.inference_mode(), pytest.raises(ValueError, match="got 0 pages"):
        r.prefill([_item(model, 0, 1, 1)])  # a one-token prompt only arms its slot: one page still
