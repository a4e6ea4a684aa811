"""The decode step's bookkeeping around the layers as two Triton kernels (TTS_FEATURES step_glue).

Between its fused layers and samplers the step ran ~35 small torch kernels a frame that move a few hundred bytes
each (a few percent of a one-row frame: docs/performance.md, "Fused decode-step kernels"):

- `step_inputs`: the slow model's input, DualAR.embed of the last frame (the token's embedding plus, for semantic
  tokens, the sum of the ten codebook embeddings, scaled by 1/sqrt(n+1) where the config says so) and the RoPE row
  of each row's position: one program per (row, block of the model dim).
- `finish_step`: the end of Runner.decode_step: the frame recorded in the repetition window (rows that are active
  and not fresh), kept or replaced by the row's previous frame (inactive rows), copied to the state and the output,
  `fresh` cleared where active, position and frame counter advanced: one program per row, integers only (exact).

Roundings of `step_inputs` (16-bit weights only; fp32 keeps the eager ops): the codebook sum accumulates in fp32 and
rounds once, as torch's sum of a 16-bit tensor (equal bits whenever the fp32 sum of the ten values is exact, i.e.
their exponents span < 16 bits; otherwise torch's and this order may differ in the sum's last fp32 bit, rarely
visible after rounding); the add rounds; the scale is CUDA's division by a Python scalar, x * (1 / float32(s)) in
fp32 (aten's div_true_kernel_cuda multiplies by the reciprocal), rounded.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .triton_support import next_pow2

try:  # absent or broken Triton: the module still imports; the kernels are then never chosen
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

BLOCK_D = 256  # model-dim columns per step_inputs program (D = 1024: four programs a row)

if triton is not None:
    @triton.jit
    def _inputs_kernel(FRAMES, s_f, TOK_EMB, CB_EMB, s_e, ROPE_TAB, s_r, POS, X, s_x, ROPE_OUT, s_ro, D, R, CB,
                       BEGIN, END, INV_SCALE, N: tl.constexpr, SCALE: tl.constexpr, BLOCK: tl.constexpr,
                       RP: tl.constexpr):
        b = tl.program_id(0)
        blk = tl.program_id(1)
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        ok = cols < D
        tok = tl.load(FRAMES + b * s_f)
        semantic = (tok >= BEGIN) & (tok <= END)
        vq = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(N):  # codebook k's table starts at row k * CB (DualAR.embed's offsets)
            code = tl.load(FRAMES + b * s_f + 1 + k)
            vq += tl.load(CB_EMB + (code + k * CB) * s_e + cols, mask=ok, other=0.0).to(tl.float32)
        DT = X.dtype.element_ty
        vq = vq.to(DT).to(tl.float32)  # the sum's own rounding
        e = tl.load(TOK_EMB + tok * s_e + cols, mask=ok, other=0.0).to(tl.float32)
        x = (e + tl.where(semantic, vq, 0.0)).to(DT).to(tl.float32)
        if SCALE:
            x = tl.where(semantic, (x * INV_SCALE).to(DT).to(tl.float32), x)
        tl.store(X + b * s_x + cols, x.to(DT), mask=ok)
        if blk == 0:  # the row's RoPE table entry (d/2 x 2 values, contiguous)
            r = tl.arange(0, RP)
            pos = tl.load(POS + b)
            tl.store(ROPE_OUT + b * s_ro + r, tl.load(ROPE_TAB + pos * s_r + r, mask=r < R), mask=r < R)

    @triton.jit
    def _finish_kernel(FRAME, s_fr, ACTIVE, FRESH, STATE, s_st, OUT, s_o, POS, FIDX, WIN, s_w0, s_w1, COUNT, N1, W,
                       NP: tl.constexpr):
        b = tl.program_id(0)
        j = tl.arange(0, NP)
        ok = j < N1
        frame = tl.load(FRAME + b * s_fr + j, mask=ok, other=0)
        act = tl.load(ACTIVE + b).to(tl.int64)  # bools as 0 / 1
        fresh = tl.load(FRESH + b).to(tl.int64)
        count = tl.load(COUNT + b)
        record = act * (1 - fresh)  # upstream never records a stream's first frame
        tl.store(WIN + b * s_w0 + j * s_w1 + count % W, frame, mask=ok & (j * 0 + record != 0))
        tl.store(COUNT + b, count + record)
        kept = tl.where(j * 0 + act != 0, frame, tl.load(STATE + b * s_st + j, mask=ok, other=0))
        tl.store(STATE + b * s_st + j, kept, mask=ok)
        tl.store(OUT + b * s_o + j, kept, mask=ok)
        tl.store(FRESH + b, (fresh * (1 - act)).to(FRESH.dtype.element_ty))
        tl.store(POS + b, tl.load(POS + b) + act)
        tl.store(FIDX + b, tl.load(FIDX + b) + act)


def inputs_supported(model) -> bool:
    """Whether step_inputs covers `model`: 16-bit embeddings (fp32 keeps the eager ops, see the module docstring),
    the token and codebook tables in one dtype and row width."""
    emb, cb = model.embeddings.weight, model.codebook_embeddings.weight
    return (emb.dtype in (torch.bfloat16, torch.float16) and cb.dtype == emb.dtype and emb.stride() == cb.stride()
            and emb.stride(1) == 1 and model.rope_slow.is_contiguous())


def step_inputs(model, frames: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """frames int64 [B, n+1] (each row's last frame), pos int64 [B] -> (x [B, 1, D] = model.embed of the frames,
    rope [B, 1, d/2, 2] = model.rope_slow[pos]), in one launch (CUDA, or Triton's interpreter)."""
    B, n1 = frames.shape
    if frames.stride(1) != 1:
        raise ValueError("step_inputs: frames need unit stride along the frame")
    cfg = model.cfg
    emb, cb = model.embeddings.weight, model.codebook_embeddings.weight
    D = emb.shape[1]
    tab = model.rope_slow  # [L, d/2, 2]
    x = torch.empty((B, 1, D), dtype=emb.dtype, device=emb.device)
    rope = torch.empty((B, 1, *tab.shape[1:]), dtype=tab.dtype, device=tab.device)
    R = tab.shape[1] * tab.shape[2]
    scale = bool(cfg.scale_codebook_embeddings)
    inv = _inverse_scale(n1)
    _inputs_kernel[(B, -(-D // BLOCK_D))](
        frames, frames.stride(0), emb, cb, emb.stride(0), tab, tab.stride(0), pos, x, x.stride(0), rope,
        rope.stride(0), D, R, cfg.codebook_size, model.semantic_begin_id, model.semantic_end_id, inv,
        N=n1 - 1, SCALE=scale, BLOCK=BLOCK_D, RP=next_pow2(R), num_warps=4)
    return x, rope


def finish_step(frame: Tensor, active: Tensor, fresh: Tensor, state: Tensor, out: Tensor, pos: Tensor,
                frame_index: Tensor, window) -> None:
    """Runner.decode_step's end in one launch: frame int64 [B, n+1] (this step's), active / fresh bool [B]; updates
    state (the rows' last frames), out, fresh, pos, frame_index [B] and the window (sampling.RepetitionWindow view)
    in place, as finish_step_reference."""
    B, n1 = frame.shape
    win = window.frames
    for t, name in ((frame, "frame"), (state, "state"), (out, "out"), (win.transpose(1, 2), "window")):
        if t.stride(1) != 1:
            raise ValueError(f"finish_step: {name} needs unit stride along its last dimension")
    _finish_kernel[(B,)](frame, frame.stride(0), active, fresh, state, state.stride(0), out, out.stride(0), pos,
                         frame_index, win, win.stride(0), win.stride(1), window.count, n1, win.shape[2],
                         NP=next_pow2(n1), num_warps=1)


@functools.lru_cache(maxsize=8)
def _inverse_scale(n1: int) -> float:
    # CUDA's x / s for a Python scalar s = sqrt(n + 1): x * (1 / float32(s)), the reciprocal in float32
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(n1 ** 0.5, dtype=torch.float32))


def finish_step_reference(frame: Tensor, active: Tensor, fresh: Tensor, state: Tensor, out: Tensor, pos: Tensor,
                          frame_index: Tensor, window) -> None:
    """The eager ops finish_step fuses (the end of Runner.decode_step)."""
    window.record(frame, active & ~fresh)  # upstream never records the first frame
    frame = torch.where(active[:, None], frame, state)
    state.copy_(frame)
    out.copy_(frame)
    fresh.copy_(fresh & ~active)
    step = active.to(torch.int64)
    pos.add_(step)
    frame_index.add_(step)


def step_inputs_reference(model, frames: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """The eager ops step_inputs fuses (the start of Runner.decode_step)."""
    return model.embed(frames[:, :, None]), model.rope_slow[pos][:, None]

