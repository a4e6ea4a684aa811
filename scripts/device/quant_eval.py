"""bf16 vs int8 vs int4 on random-weight S1-mini (CUDA): weight bytes, teacher-forced logit error,
greedy code agreement over 32 frames, codec SNR, and the LLM decode-step time (compiled units in a
CUDA graph; 64 rows with 256-token contexts, and 2 rows). One JSON line per measurement.

Run on a GPU machine: PYTHONPATH=container python3 scripts/device/quant_eval.py
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import torch

from ttsengine.engine.generator import raw_frames
from ttsengine.engine.runner import Runner, RunnerConfig
from ttsengine.model.layers import causal_mask_from_positions
from ttsengine.model.quant import quantize, weight_bytes
from ttsengine.model.sampling import SamplingTensors
from ttsengine.model.synthetic import random_checkpoint

DEV = torch.device("cuda")
MODES = ("bf16", "int8", "int4")


def quantized(base, mode: str):
    if mode == "bf16":
        return base, "none"
    ck = dataclasses.replace(base, model=copy.deepcopy(base.model), codec=copy.deepcopy(base.codec))
    return ck, f"{quantize(ck.model, mode)} | codec {quantize(ck.codec, mode)}"


def outputs(ck, prompt: torch.Tensor, codes: torch.Tensor):
    T = prompt.shape[1]
    pos = torch.arange(T, device=DEV)[None]
    with torch.inference_mode():
        hidden = ck.model.slow_forward(ck.model.embed(prompt.to(DEV)[None]), pos, causal_mask_from_positions(pos, T))
        logits = ck.model.slow_head(hidden)[0].float()
        params = SamplingTensors.from_values([(0.7, 1e-6, 1.0, 0)], DEV)  # greedy
        frames = torch.stack(list(raw_frames(ck.model, prompt, params, 32, -1, 16)), 1)
        audio = ck.codec.decode(codes)[0, 0].float()
    return logits, frames, audio


def step_ms(model, buckets=(64, 2)) -> dict[int, float]:
    r = Runner(model, RunnerConfig(max_slots=64, page_size=64, num_pages=64 * 7 + 1, penalty_window=16,
                                   triton_attention=True))
    r.enable_compile()
    r.ensure_pages([(s, 400) for s in range(64)])
    out = {}
    with torch.inference_mode():
        for bb in buckets:
            r.pos[:64], r.active[:64], r.fresh[:64] = 256, True, False
            r.decode_step(bb)
            r.decode_step(bb)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                r.decode_step(bb)
            r.pos[:64] = 256
            graph.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                graph.replay()
            torch.cuda.synchronize()
            out[bb] = (time.perf_counter() - t) / 30 * 1000
    return out


def main() -> None:
    base = random_checkpoint("s1-mini", DEV, torch.bfloat16, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompt = torch.zeros(11, 96, dtype=torch.long)
    prompt[0] = torch.randint(0, 255, (96,), generator=g)
    codes = torch.cat([torch.randint(0, 4096, (1, 1, 64), generator=g),
                       torch.randint(0, 1024, (1, 9, 64), generator=g)], 1).to(DEV)
    ref = outputs(base, prompt, codes)
    for mode in MODES:
        torch.cuda.reset_peak_memory_stats()
        try:
            ck, how = quantized(base, mode)
            logits, frames, audio = outputs(ck, prompt, codes)
            noise = (audio - ref[2]).pow(2).sum().clamp(min=1e-20)
            row = {"mode": mode, "how": how, "llm_gb": weight_bytes(ck.model) / 1e9,
                   "codec_gb": weight_bytes(ck.codec) / 1e9,
                   "logit_rel_err": ((logits - ref[0]).norm() / ref[0].norm()).item(),
                   "greedy_code_agreement": (frames == ref[1]).float().mean().item(),
                   "codec_snr_db": 10 * torch.log10(ref[2].pow(2).sum() / noise).item()}
            t = time.perf_counter()
            ms = step_ms(ck.model)
            row.update({"step_ms_bb64": ms[64], "step_ms_bb2": ms[2], "llm_frames_per_s_64": 64e3 / ms[64],
                        "llm_frames_per_s_1": 1e3 / ms[2], "compile_and_capture_s": time.perf_counter() - t,
                        "vram_allocated_gb": torch.cuda.memory_allocated() / 1e9,
                        "peak_vram_gb": torch.cuda.max_memory_allocated() / 1e9})
        except Exception as e:  # noqa: BLE001 - report and go on to the next mode
            row = {"mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
