"""The device side of the batched engine: per-slot state, the paged KV cache, prefill and the decode
step. Everything the step reads or writes lives in fixed buffers of `max_slots` rows, so a batch
bucket's step can be captured once in a CUDA graph (engine/device/cuda_graphs.py) and replayed while requests
come and go. The step has no host sync; the host reads its output with one copy per step.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from ...compat import want_recompile_limit
from ...model import fast_stack, fused_layer
from ...model.dual_ar import DualAR
from ...model.frame import sample_frame
from ...model.kernels import step_glue
from ...model.kernels.launch import pdl_runs
from ...model.kernels.paged_attention import PagedKV, write_and_attend_eager, write_and_attend_op
from ...model.layers import attend
from ...model.sampling import RepetitionWindow, SamplingTensors, register_top_p_op
from ..features import FAST_STACK, LAYER_GEMV, MERGED_FFN, PDL, SPLIT_ATTENTION, STEP_GLUE
from .compile.units import StepOps

log = logging.getLogger(__name__)

# Prefill shapes (engine/device/cuda_graphs.py keys): prompts padded up to these rows and positions; a padded
# prefill of more than PREFILL_GRAPH_TOKENS positions runs uncaptured (its graph's activations would be large).
PREFILL_ROWS = (1, 2, 4, 8, 16, 32, 64)  # a prefill call's rows, up to RunnerConfig.prefill_group
PREFILL_POSITIONS = (64, 128, 256, 512, 1024, 2048)
PREFILL_GRAPH_TOKENS = 8192
# A prefill with history (a prefix-cache hit, a later chunk of a long prompt) also reads the pages before its
# first position: its key gains the pages it gathers, padded up to one of these (coarse: a gather of a few
# pages more costs little, a graph per page count would multiply the graphs). Graphs only for the short new
# parts a hit has (the prefix's last partial page plus the request's text): a chunk of a long prompt is
# compute-bound and runs uncaptured, and PREFILL_HISTORY_GRAPH_POSITIONS bounds each graph's gathered keys.
PREFILL_HISTORY_PAGES = (2, 8, 32, 128, 512)
PREFILL_HISTORY_GRAPH_POSITIONS = (64, 128)
PREFILL_HISTORY_GRAPH_KEYS = 16384


@dataclass(frozen=True)
class RunnerConfig:
    max_slots: int
    page_size: int
    num_pages: int  # including the scratch page 0
    penalty_window: int
    triton_attention: bool  # the Triton paged kernel (CUDA) instead of the gather + SDPA reference
    fused: frozenset[str] = frozenset()  # the step's fused kernels on (engine/features.py; compile/units.py)
    gemv_rows: int = 16  # with layer_gemv, steps of up to this many rows run its kernels (TTS_LAYER_GEMV_ROWS)
    prefill_group: int = 8  # prompts per prefill call with prefill graphs, a power of two (TTS_PREFILL_GROUP)


@dataclass
class PrefillItem:
    """Prompt positions [start, end) of one stream (end None: all but the last, T - 1). The chunk that reaches
    T - 1 arms the slot; positions before `start` are in the slot's pages already (a cached prefix, earlier chunks)."""

    slot: int
    prompt: Tensor  # int64 [n+1, T] on CPU
    params: tuple[float, float, float, int]  # temperature, top_p, repetition_penalty, seed
    frame_offset: int  # frames the request generated before (RNG counter start)
    start: int = 0
    end: int | None = None
    pages: tuple[int, ...] = ()  # the slot's KV pages in position order, through `stop` at least (the page pool's)

    @property
    def stop(self) -> int:
        return self.prompt.shape[1] - 1 if self.end is None else self.end

    @property
    def last(self) -> bool:
        return self.stop == self.prompt.shape[1] - 1


class Runner:
    def __init__(self, model: DualAR, cfg: RunnerConfig):
        self.model, self.cfg = model, cfg
        self.prefill_rows = tuple(r for r in PREFILL_ROWS if r <= cfg.prefill_group)  # padded row counts of a call
        self.compiled = False  # the step's units run through torch.compile (enable_compile)
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
        self.fresh = torch.zeros(S, dtype=torch.bool, device=dev)  # the next frame is the stream's first
        self.out = torch.zeros(S, n + 1, dtype=torch.int64, device=dev)  # frames made by the last step
        self._attend = write_and_attend_op()  # what compiled units call: the op a trace keeps opaque
        gemv = LAYER_GEMV in cfg.fused
        if MERGED_FFN in cfg.fused or gemv:  # W1|W3 as one matmul in the step's layers (their weights become views)
            for layer in (*model.layers, *model.fast_layers):
                layer.feed_forward.merge_inputs()
                if gemv:
                    layer.feed_forward.merge_int8_inputs()
        self.ops = StepOps.eager(write_and_attend_eager, cfg.triton_attention, cfg.fused)
        # layer_gemv: steps of up to cfg.gemv_rows (<= fused_layer.MAX_ROWS) rows run each layer as five fused kernels
        # (fused_layer.py)
        self.gemv_rows = 0
        self.pdl = False
        self.splits = 1
        if (gemv and all(fused_layer.layer_supported(layer) for layer in (*model.layers, *model.fast_layers))
                and fused_layer.linear_weight(model.fast_output) is not None):
            self.gemv_rows = min(cfg.gemv_rows, fused_layer.MAX_ROWS)
            # pdl: its kernels launched as programmatic dependents, each loading weights while the previous runs
            self.pdl = PDL in cfg.fused and pdl_runs(self.device)
            # split_attention: at few rows each row and KV head's pages shared by several programs (+ one combine)
            self.splits = fused_layer.MAX_SPLITS if SPLIT_ATTENTION in cfg.fused and cfg.triton_attention else 1
            self._gemv_layer = fused_layer.make_layer(cfg.triton_attention, self.pdl, self.splits)
            self._gemv_head = fused_layer.make_fast_head(self.pdl)
        elif gemv:
            log.warning("TTS_FEATURES: layer_gemv needs bias-free bf16/fp16/fp32 or int8 linears; the step runs "
                        "without it")
        # fast_stack: steps of up to fast_stack.MAX_ROWS rows run all fast layers at a position as one persistent
        # kernel (model/fast_stack.py); on top of layer_gemv, whose layout (merged W1|W3) it reads
        self.stack_rows = 0
        if FAST_STACK in cfg.fused and self.gemv_rows and fast_stack.kernel_runs(self.device):
            weights = fast_stack.stack_fast_layers(model)
            if weights is not None:
                self.stack_rows = fast_stack.MAX_ROWS
                self._fast_stack = fast_stack.make_fast_stack(weights)
        if PDL in cfg.fused and not self.pdl and (self.gemv_rows or LAYER_GEMV not in cfg.fused):
            # (layer_gemv asked for but not usable has its own warning above)
            log.warning("TTS_FEATURES: pdl needs layer_gemv, an NVIDIA GPU of compute capability 9.0+ with a "
                        "CUDA 12.3+ driver and a Triton with grid dependency control; its kernels launch as usual")
        if FAST_STACK in cfg.fused and not self.stack_rows:
            log.warning("TTS_FEATURES: fast_stack needs layer_gemv, Triton on CUDA (or its interpreter) and fast "
                        "layers it reads (power-of-two heads); the step runs without it")
        # step_glue: the step's start and end as two Triton kernels (model/kernels/step_glue.py), else the eager ops
        glue = STEP_GLUE in cfg.fused and self.device.type == "cuda"
        self._finish_step = step_glue.finish_step if glue else step_glue.finish_step_reference
        self._step_inputs = (step_glue.step_inputs if glue and step_glue.inputs_supported(model)
                             else step_glue.step_inputs_reference)
        # a GraphSet over prefill_layers keyed by prefill_key (device.py's). The pages are the control plane's
        # (control/page_pool.py): a slot's device page_table row lists them only once it is armed (its last prefill
        # chunk ran); until then the decode step computes the row as idle, writing to scratch, never into its pages.
        self.prefill_graphs = None

    def _device_tensor(self, values: list[int]) -> Tensor:
        """int64 values on the device without waiting for it: a plain torch.tensor(..., device=cuda) copies and then
        syncs the stream, which would wait for the step in flight (engine.py overlaps steps); a non-blocking copy
        from pageable memory is staged at once and ordered on the stream like the work around it."""
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)

    # ---- pages --------------------------------------------------------------------------------
    def write_table(self, entries: list[tuple[int, int, int]]) -> None:
        """(slot, index, page) entries new to the page tables of decoding slots (armed: their last prefill ran), in one
        small host-to-device copy."""
        if entries:
            idx = torch.tensor(entries, dtype=torch.int64).T.to(self.device, non_blocking=True)
            self.page_table.index_put_((idx[0], idx[1]), idx[2].to(torch.int32))

    def host_table(self, pages: list[tuple[int, ...]], width: int) -> Tensor:
        """Page lists (one per row) -> int32 [len(pages), width] on the device, unlisted pages scratch."""
        table = torch.zeros(len(pages), width, dtype=torch.int32)
        for i, held in enumerate(pages):
            held = held[:width]
            table[i, : len(held)] = torch.tensor(held, dtype=torch.int32)
        return table.to(self.device, non_blocking=True)

    def reset_slots(self, slots) -> None:
        slots = list(slots)
        if slots:
            self._reset_rows(self._device_tensor(slots))

    def _reset_rows(self, rows: Tensor) -> None:
        # idle rows point every page at scratch, so a bucket's step may compute them harmlessly
        self.page_table.index_fill_(0, rows, 0)
        self.active.index_fill_(0, rows, False)
        self.fresh.index_fill_(0, rows, False)
        self.pos.index_fill_(0, rows, 0)

    def move_slot(self, src: int, dst: int) -> None:
        """Moves a running stream's state from row src to row dst (dst is free)."""
        p = self.params
        for t in (self.page_table, self.frames, self.pos, self.frame_index, self.active, self.fresh, p.temperature,
                  p.top_p, p.repetition_penalty, p.seed_lo, p.seed_hi, self.window.frames, self.window.count):
            t[dst] = t[src]
        self._reset_rows(self._device_tensor([src]))

    # ---- prefill ------------------------------------------------------------------------------
    def prefill_key(self, g: int, T: int, history: int = 0) -> tuple[int, int, int]:
        """(rows, positions, history pages) a prefill of g prompt parts of up to T positions is padded to: few
        shapes, so each can be a CUDA graph (the padding is masked and writes to the scratch page, so it changes
        no value). history: the highest position + 1 any row reads (0: the parts start at position 0 and read
        only themselves) -> the pages gathered per row, padded to PREFILL_HISTORY_PAGES."""
        rows = next((b for b in self.prefill_rows if b >= g), g)
        cap = self.model.cfg.cache_len  # padded positions index the RoPE table
        positions = min(next((b for b in PREFILL_POSITIONS if b >= T), T), cap)
        if history == 0:
            return rows, positions, 0
        need = -(-history // self.cfg.page_size)
        pages = min(next((b for b in PREFILL_HISTORY_PAGES if b >= need), need), self.max_pages_per_seq)
        return rows, positions, pages

    def prefill_graph_keys(self) -> list[tuple[int, int, int]]:
        """The padded shapes worth a CUDA graph: every key up to PREFILL_GRAPH_TOKENS padded positions, and with
        history the short parts (PREFILL_HISTORY_GRAPH_POSITIONS) up to PREFILL_HISTORY_GRAPH_KEYS gathered
        positions (a larger prefill runs uncaptured: GraphSet runs an unplanned key as plain work)."""
        keys = {self.prefill_key(g, t) for g in self.prefill_rows for t in PREFILL_POSITIONS}
        keys = {k for k in keys if k[0] * k[1] <= PREFILL_GRAPH_TOKENS}
        ps = self.cfg.page_size
        for g in self.prefill_rows:
            for t in PREFILL_HISTORY_GRAPH_POSITIONS:
                for pages in PREFILL_HISTORY_PAGES:
                    key = self.prefill_key(g, t, pages * ps)
                    if key[0] * key[2] * ps <= PREFILL_HISTORY_GRAPH_KEYS:
                        keys.add(key)
        return sorted(keys)

    def prefill(self, items: list[PrefillItem]) -> None:
        """Writes the KV cache of each item's prompt positions [start, stop). An item that reaches its prompt's
        last position arms its slot: the prompt's last column becomes the slot's next input, so the (graphed)
        decode step samples the first frame, without repetition penalty (the `fresh` flag) as upstream does. Each
        item's pages cover its positions (the control plane allocated them: control/scheduler.py schedule)."""
        for it in items:  # pages left out would send the item's keys to the scratch page without a word
            need = it.stop if it.last else it.stop - 1
            if (it.last or it.stop > it.start) and len(it.pages) * self.cfg.page_size <= need:
                raise ValueError(f"prefill of slot {it.slot} up to position {need} got {len(it.pages)} pages of "
                                 f"{self.cfg.page_size}")
        # parts from position 0 attend only within themselves (the first prefill of a stream: no gather); parts
        # with history read the slot's earlier positions through its pages
        fresh = [it for it in items if it.start == 0]
        later = [it for it in items if it.start > 0]
        # with prefill graphs: groups of at most cfg.prefill_group prompts (each one graph); without, one padded call
        for part in (fresh, later):
            top = self.prefill_rows[-1] if self.prefill_graphs is not None else max(len(part), 1)
            for i in range(0, len(part), top):
                self._prefill_group(part[i:i + top])
        self._arm([it for it in items if it.last])

    def _arm(self, items: list[PrefillItem]) -> None:
        if not items:
            return
        dev = self.device
        slots = self._device_tensor([it.slot for it in items])
        self.page_table.index_copy_(0, slots, self.host_table([it.pages for it in items], self.max_pages_per_seq))
        last = torch.stack([it.prompt[:, -1] for it in items]).to(dev, non_blocking=True)  # [g, n+1]
        params = SamplingTensors.from_values([it.params for it in items], dev)
        for name in ("temperature", "top_p", "repetition_penalty", "seed_lo", "seed_hi"):
            getattr(self.params, name).index_copy_(0, slots, getattr(params, name))
        self.frames.index_copy_(0, slots, last)
        self.pos.index_copy_(0, slots, self._device_tensor([it.prompt.shape[1] - 1 for it in items]))
        self.frame_index.index_copy_(0, slots, self._device_tensor([it.frame_offset for it in items]))
        self.active.index_fill_(0, slots, True)
        self.fresh.index_fill_(0, slots, True)
        self.window.reset_rows(torch.zeros_like(self.active).index_fill_(0, slots, True))

    def _prefill_group(self, items: list[PrefillItem]) -> None:
        lens = [it.stop - it.start for it in items]
        if max(lens) == 0:
            return
        history = max(it.stop for it in items) if items[0].start > 0 else 0
        key = self.prefill_key(len(items), max(lens), history)
        rows, T, pages = key
        tokens = torch.zeros(rows, self.model.cfg.num_codebooks + 1, T, dtype=torch.int64)
        for i, it in enumerate(items):
            tokens[i, :, : lens[i]] = it.prompt[:, it.start:it.stop]
        # padding rows: one position, written to the scratch page through an all-scratch table row
        valid = self._device_tensor(lens + [1] * (rows - len(items)))
        table = self.host_table([it.pages for it in items], pages or self.max_pages_per_seq)
        table = torch.cat([table, table.new_zeros(rows - len(items), table.shape[1])])
        inputs = (tokens.to(self.device, non_blocking=True), valid, table)
        if pages:
            inputs += (self._device_tensor([it.start for it in items] + [0] * (rows - len(items))),)
        if self.prefill_graphs is not None:
            self.prefill_graphs.run(key, *inputs)
        else:
            self.prefill_layers(*inputs)

    def prefill_layers(self, tokens: Tensor, lens: Tensor, table: Tensor, start: Tensor | None = None) -> Tensor:
        """The slow layers over padded prompt parts, writing positions start + [0, lens) into the paged cache (the
        rest to scratch). tokens: int64 [G, n+1, T]; lens: int64 [G] (>= 1); table: int32 [G, P]; start: int64
        [G] each part's first position (None: 0, and the parts read only themselves) -> hidden [G, T, D]
        (unused: a graph's output). With `start`, each part also reads positions [0, start) of its row through
        the table's P pages (gathered, then SDPA: the reference path; P is part of the graph key). Reads nothing
        but its arguments and the weights: a CUDA graph per shape."""
        if start is not None:
            return self._prefill_with_history(tokens, lens, table, start)
        m = self.model
        g, _, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)[None].expand(g, T)
        valid = pos < lens[:, None]
        mask = (pos[:, None, :] <= pos[:, :, None]) & valid[:, None, :]  # [g, T(q), T(k)]
        write_pos = torch.where(valid, pos, torch.full_like(pos, -1))  # padding goes to scratch
        return self._prefill_slow_layers(m.embed(tokens), m.rope_slow[pos], table, write_pos, mask, history=False)

    def _prefill_with_history(self, tokens: Tensor, lens: Tensor, table: Tensor, start: Tensor) -> Tensor:
        m = self.model
        g, _, T = tokens.shape
        step = torch.arange(T, device=tokens.device)[None]  # [1, T]
        pos = start[:, None] + step  # [g, T] absolute positions of the new tokens
        valid = step < lens[:, None]
        write_pos = torch.where(valid, pos, torch.full_like(pos, -1))  # padding goes to scratch
        keys = torch.arange(table.shape[1] * self.cfg.page_size, device=tokens.device)  # [S] gathered positions
        # a query reads every written position up to its own: the history and the new tokens before it; position
        # 0 is always readable, so a padded query's row is never all-masked (no NaN)
        mask = (keys[None, None, :] <= pos[:, :, None]) & (keys[None, None, :] < (start + lens)[:, None, None])
        rope = m.rope_slow[pos.clamp(max=m.rope_slow.shape[0] - 1)]  # padded positions may run past the table
        return self._prefill_slow_layers(m.embed(tokens), rope, table, write_pos, mask, history=True)

    def _prefill_slow_layers(self, x: Tensor, rope: Tensor, table: Tensor, write_pos: Tensor, mask: Tensor,
                             history: bool) -> Tensor:
        """x: [g, T, D] embedded parts; write_pos: int64 [g, T] (-1: scratch); mask: bool [g, T, S]. Each layer
        writes the parts' keys and values, then attends over the parts themselves (S = T) or, with history, over
        the rows' pages gathered through `table` (S = P * page_size) -> hidden [g, T, D]."""
        g, T, _ = x.shape
        for i, layer in enumerate(self.model.layers):
            att = layer.attention
            q, k, v = att.project(layer.attention_norm(x), rope)
            self.kv[i].write(table, write_pos, k, v)
            k, v = self.kv[i].gather(table) if history else (k.transpose(1, 2), v.transpose(1, 2))  # [g, Hk, S, d]
            y = attend(q.transpose(1, 2), k.to(q.dtype), v.to(q.dtype), mask[:, None])
            x = x + att.wo(y.transpose(1, 2).reshape(g, T, -1))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        return x

    def prefill_scratch_inputs(self, key: tuple[int, int, int]) -> tuple[Tensor, ...]:
        """Inputs a prefill graph of `key` may be captured on: every row writes one position to scratch."""
        rows, T, pages = key
        dev = self.device
        inputs = (torch.zeros(rows, self.model.cfg.num_codebooks + 1, T, dtype=torch.int64, device=dev),
                  torch.ones(rows, dtype=torch.int64, device=dev),
                  torch.zeros(rows, pages or self.max_pages_per_seq, dtype=torch.int32, device=dev))
        return inputs + (torch.zeros(rows, dtype=torch.int64, device=dev),) if pages else inputs

    # ---- decode step --------------------------------------------------------------------------
    def enable_compile(self, store: Path | None = None) -> None:
        """Routes the step's units through torch.compile (see compile/units.py); `store`: directory of their
        precompiled traces (None: plain torch.compile). Numerics differ from eager at bf16 rounding level."""
        register_top_p_op()
        want_recompile_limit(64)  # applied when a unit first compiles: nothing imports the compiler before that
        self.ops = StepOps.compiled(self._attend, self.cfg.triton_attention, self.cfg.max_slots, store,
                                    self.cfg.fused)
        self.compiled = True

    def precompiled(self) -> dict[str, int] | None:
        """Precompiled-unit counts ({'loaded', 'compiled'}), or None when the units are not precompiled."""
        return self.ops.precompiled()

    def disable_compile(self) -> None:
        self.ops = StepOps.eager(write_and_attend_eager, self.cfg.triton_attention, self.cfg.fused)
        self.compiled = False


    @property
    def fused_in_use(self) -> frozenset[str]:
        """The fused kernels the step runs: the configured ones less layer_gemv where the model's layers cannot take
        it, and those that need it (pdl, split_attention) without it (what the ready log and the bench report, so a
        figure never names a kernel that did not run)."""
        off = {LAYER_GEMV: not self.gemv_rows, FAST_STACK: not self.stack_rows, PDL: not self.pdl,
               # step_glue: its end kernel runs at every dtype, its start one for 16-bit embeddings only
               SPLIT_ATTENTION: self.splits == 1, STEP_GLUE: self._finish_step is step_glue.finish_step_reference}
        return self.cfg.fused - frozenset(name for name, dropped in off.items() if dropped)

    def step_ops(self, bb: int) -> StepOps:
        """The units a step of bb rows runs: the fused small-batch layers (layer_gemv) up to gemv_rows, with the fast
        layers too where they read a paged cache (fast_attention: the slow layer's signature); else self.ops."""
        if bb > self.gemv_rows:
            return self.ops
        frame = self.ops.frame
        frame = replace(frame, fast_head=self._gemv_head,
                        fast_layer=self._gemv_layer if frame.paged_fast else frame.fast_layer,
                        fast_stack=self._fast_stack if bb <= self.stack_rows else None,
                        # pdl: the sampler launched while the fast head runs, the next fast layer while it samples
                        sample_embed=(functools.partial(frame.sample_embed, pdl=True)
                                      if frame.sample_embed is not None and self.pdl else frame.sample_embed))
        return StepOps(self._gemv_layer, frame)

    def decode_step(self, bb: int) -> Tensor:
        """One frame for rows [0, bb): slow step over the paged cache, the fast loop, sampling and
        the state update, all on the device. Idle rows compute garbage into the scratch page and keep
        their state. -> self.out[:bb] (int64 [bb, n+1])."""
        m = self.model
        frames, pos, active, fresh = self.frames[:bb], self.pos[:bb], self.active[:bb], self.fresh[:bb]
        table = self.page_table[:bb]
        ops = self.step_ops(bb)
        x, rope = self._step_inputs(m, frames, pos)  # [bb, 1, D], [bb, 1, d/2, 2]
        for i, layer in enumerate(m.layers):
            x = ops.slow_layer(layer, x, rope, self.kv[i].k, self.kv[i].v, table, pos)
        hidden = x[:, 0]
        p = self.params
        params = SamplingTensors(p.temperature[:bb], p.top_p[:bb], p.repetition_penalty[:bb], p.seed_lo[:bb],
                                 p.seed_hi[:bb])
        window = self.window.view(bb)
        frame = sample_frame(m, m.slow_head(hidden), hidden, params, self.frame_index[:bb], window, fresh, ops.frame)
        # the window record, the kept frame into the state and the output, fresh, pos and the frame counter
        self._finish_step(frame, active, fresh, frames, self.out[:bb], pos, self.frame_index[:bb], window)
        return self.out[:bb]
