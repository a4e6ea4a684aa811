"""The device side of the batched engine: per-slot state, the paged KV cache, prefill and the decode
step. Everything the step reads or writes lives in fixed buffers of `max_slots` rows, so a batch
bucket's step can be captured once in a CUDA graph (engine/graphs.py) and replayed while requests
come and go. The step has no host sync; the host reads its output with one copy per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.dual_ar import DualAR
from ..model.frame import sample_frame
from ..model.layers import attend
from ..model.paged_attention import PagedKV, write_and_attend_op
from ..model.sampling import RepetitionWindow, SamplingTensors


@dataclass(frozen=True)
class RunnerConfig:
    max_slots: int
    page_size: int
    num_pages: int  # including the scratch page 0
    penalty_window: int
    triton_attention: bool  # the Triton paged kernel (CUDA) instead of the gather + SDPA reference


@dataclass
class PrefillItem:
    slot: int
    prompt: Tensor  # int64 [n+1, T] on CPU
    params: tuple[float, float, float, int]  # temperature, top_p, repetition_penalty, seed
    frame_offset: int  # frames the request generated before (RNG counter start)


class Runner:
    def __init__(self, model: DualAR, cfg: RunnerConfig):
        self.model, self.cfg = model, cfg
        p = model.norm.weight
        self.device, self.dtype = p.device, p.dtype
        mc = model.cfg
        S, n = cfg.max_slots, mc.num_codebooks
        self.max_pages_per_seq = -(-mc.cache_len // cfg.page_size)
        self.kv = [PagedKV.empty(cfg.num_pages, mc.slow.n_local_heads, cfg.page_size, mc.slow.head_dim, self.dtype,
                           self.device) for _ in range(mc.slow.n_layer)]
        dev = self.device
        self.page_table = torch.zeros(S, self.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.frames = torch.zeros(S, n + 1, dtype=torch.int64, device=dev)  # the next step's input frame
        self.pos = torch.zeros(S, dtype=torch.int64, device=dev)  # that frame's position
        self.frame_index = torch.zeros(S, dtype=torch.int64, device=dev)  # RNG counter of the next frame
        self.active = torch.zeros(S, dtype=torch.bool, device=dev)
        self.params = SamplingTensors(
            temperature=torch.ones(S, device=dev), top_p=torch.ones(S, device=dev),
            repetition_penalty=torch.ones(S, device=dev),
            seed_lo=torch.zeros(S, dtype=torch.int64, device=dev),
            seed_hi=torch.zeros(S, dtype=torch.int64, device=dev))
        self.window = RepetitionWindow.empty(S, n + 1, cfg.penalty_window, dev)
        self.out = torch.zeros(S, n + 1, dtype=torch.int64, device=dev)  # frames made by the last step
        self._attend = write_and_attend_op()
        # host side: pages held per slot; page 0 is scratch and never handed out
        self.slot_pages: list[list[int]] = [[] for _ in range(S)]
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))

    # ---- pages --------------------------------------------------------------------------------
    def ensure_pages(self, needs: list[tuple[int, int]]) -> None:
        """needs: (slot, highest position it will write). Allocates pages and updates the table with
        one small host-to-device copy."""
        updates: list[tuple[int, int, int]] = []
        for slot, last_pos in needs:
            held = self.slot_pages[slot]
            while len(held) <= last_pos // self.cfg.page_size:
                page = self.free_pages.pop()  # the scheduler's reservations guarantee there is one
                updates.append((slot, len(held), page))
                held.append(page)
        if updates:
            idx = torch.tensor(updates, dtype=torch.int64).T.to(self.device, non_blocking=True)
            self.page_table.index_put_((idx[0], idx[1]), idx[2].to(torch.int32))

    def release_pages(self, slot: int) -> None:
        """Returns a finished stream's pages; its row is reset by reset_slots or overwritten by a move."""
        self.free_pages.extend(self.slot_pages[slot])
        self.slot_pages[slot] = []

    def reset_slots(self, slots) -> None:
        slots = list(slots)
        if slots:
            self._reset_rows(torch.tensor(slots, device=self.device))

    def _reset_rows(self, rows: Tensor) -> None:
        # idle rows point every page at scratch, so a bucket's step may compute them harmlessly
        self.page_table.index_fill_(0, rows, 0)
        self.active.index_fill_(0, rows, False)
        self.pos.index_fill_(0, rows, 0)

    def move_slot(self, src: int, dst: int) -> None:
        """Moves a running stream's state from row src to row dst (dst is free)."""
        for t in (self.page_table, self.frames, self.pos, self.frame_index, self.active, self.params.temperature,
                  self.params.top_p, self.params.repetition_penalty, self.params.seed_lo, self.params.seed_hi,
                  self.window.frames, self.window.count):
            t[dst] = t[src]
        self.slot_pages[dst], self.slot_pages[src] = self.slot_pages[src], []
        self._reset_rows(torch.tensor([src], device=self.device))

    # ---- prefill ------------------------------------------------------------------------------
    def prefill(self, items: list[PrefillItem]) -> Tensor:
        """Runs the prompts of newly admitted streams (padded to one length, each attending to its own
        tokens), samples each one's first frame and arms its slot. -> frames [g, n+1] on device."""
        m, dev = self.model, self.device
        g = len(items)
        lens = torch.tensor([it.prompt.shape[1] for it in items], device=dev)
        T = int(max(it.prompt.shape[1] for it in items))
        tokens = torch.zeros(g, m.cfg.num_codebooks + 1, T, dtype=torch.int64)
        for i, it in enumerate(items):
            tokens[i, :, : it.prompt.shape[1]] = it.prompt
        tokens = tokens.to(dev, non_blocking=True)
        slots = torch.tensor([it.slot for it in items], device=dev)
        self.ensure_pages([(it.slot, it.prompt.shape[1]) for it in items])  # the prompt + the first decode

        pos = torch.arange(T, device=dev)[None].expand(g, T)
        valid = pos < lens[:, None]
        mask = (pos[:, None, :] <= pos[:, :, None]) & valid[:, None, :]  # [g, T(q), T(k)]
        write_pos = torch.where(valid, pos, torch.full_like(pos, -1))
        table = self.page_table.index_select(0, slots)
        rope = m.rope_slow[pos]
        x = m.embed(tokens)
        for i, layer in enumerate(m.layers):
            att = layer.attention
            q, k, v = att.project(layer.attention_norm(x), rope)
            self.kv[i].write(table, write_pos, k, v)
            y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask[:, None])
            x = x + att.wo(y.transpose(1, 2).reshape(g, T, -1))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        hidden = x[torch.arange(g, device=dev), lens - 1]  # [g, D]

        params = SamplingTensors.from_values([it.params for it in items], dev)
        offsets = torch.tensor([it.frame_offset for it in items], dtype=torch.int64, device=dev)
        fast = m.new_fast_caches(g, self.dtype, dev)
        frame = sample_frame(m, m.slow_head(hidden), hidden, params, offsets, fast, window=None)

        for name in ("temperature", "top_p", "repetition_penalty", "seed_lo", "seed_hi"):
            getattr(self.params, name).index_copy_(0, slots, getattr(params, name))
        self.frames.index_copy_(0, slots, frame)
        self.pos.index_copy_(0, slots, lens)
        self.frame_index.index_copy_(0, slots, offsets + 1)
        self.active.index_fill_(0, slots, True)
        self.window.reset_rows(torch.zeros_like(self.active).index_fill_(0, slots, True))
        return frame

    # ---- decode step --------------------------------------------------------------------------
    def enable_compile(self) -> None:
        """Routes decode steps through torch.compile (batch dimension dynamic: one compile serves every
        bucket). Numerics differ from eager at bf16 rounding level."""
        from torch import _dynamo

        _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
        self._step = torch.compile(self._step_impl, dynamic=None, fullgraph=True)
        self._compiled = True

    def disable_compile(self) -> None:
        self._step, self._compiled = None, False

    _step = None
    _compiled = False

    def decode_step(self, bb: int) -> Tensor:
        """One frame for rows [0, bb): slow step over the paged cache, the fast loop, sampling and
        the state update, all on the device. Idle rows compute garbage into the scratch page and keep
        their state. -> self.out[:bb] (int64 [bb, n+1])."""
        p, w = self.params, self.window
        views = (self.frames[:bb], self.pos[:bb], self.active[:bb], self.page_table[:bb], self.frame_index[:bb],
                 p.temperature[:bb], p.top_p[:bb], p.repetition_penalty[:bb], p.seed_lo[:bb], p.seed_hi[:bb],
                 w.frames[:bb], w.count[:bb], self.out[:bb])
        if self._compiled:
            from torch import _dynamo

            for t in views:  # size-1 dims are always specialised, so compiled buckets start at 2
                _dynamo.mark_dynamic(t, 0, min=2, max=self.cfg.max_slots)
            self._step(*views)
        else:
            self._step_impl(*views)
        return self.out[:bb]

    def _step_impl(self, frames: Tensor, pos: Tensor, active: Tensor, table: Tensor, frame_index: Tensor,
                   temperature: Tensor, top_p: Tensor, penalty: Tensor, seed_lo: Tensor, seed_hi: Tensor,
                   win_frames: Tensor, win_count: Tensor, out: Tensor) -> None:
        # every argument: rows [0, bb) of a slot buffer; updated in place
        m = self.model
        bb = frames.shape[0]
        rope = m.rope_slow[pos][:, None]  # [bb, 1, d/2, 2]
        x = m.embed(frames[:, :, None])  # [bb, 1, D]
        for i, layer in enumerate(m.layers):
            att = layer.attention
            q, k, v = att.project(layer.attention_norm(x), rope)
            y = self._attend(q[:, 0], k[:, 0], v[:, 0], self.kv[i].k, self.kv[i].v, table, pos,
                             self.cfg.triton_attention)
            x = x + att.wo(y.reshape(bb, 1, -1))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        hidden = x[:, 0]
        params = SamplingTensors(temperature, top_p, penalty, seed_lo, seed_hi)
        window = RepetitionWindow(win_frames, win_count)
        fast = m.new_fast_caches(bb, self.dtype, self.device)
        frame = sample_frame(m, m.slow_head(hidden), hidden, params, frame_index, fast, window)
        window.record(frame, active)
        frame = torch.where(active[:, None], frame, frames)
        frames.copy_(frame)
        out.copy_(frame)
        step = active.to(torch.int64)
        pos.add_(step)
        frame_index.add_(step)
