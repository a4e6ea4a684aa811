"""`python -m ttsengine bench --codec-only`: the streaming codec alone, apart from the LLM.

N streams decode `--chunk-frames`-frame chunks of random codes through the engine's own Vocoder (its
worker thread and CUDA stream, padding, CUDA graphs and compile switches as the engine sets them),
one batched call per chunk for all streams, for `--seconds` of audio per stream. Per mode: frames/s,
audio seconds per second, ms per call; `whole` decodes the same chunks without streaming state (the
ceiling the streaming path is measured against). `--profile` adds the top GPU kernels of one mode.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..engine.device.vocoder import VOCODER_GRAPH_ROWS, CodecSwitches, Vocoder
from ..engine.settings import codec_buckets
from ..model.codec import Codec

# each mode may end in "+cudnn" (cudnn.benchmark on for the whole run) or "+tuned" (on only while the codec's
# graphs are first run and recorded: the engine's default, the feature cudnn_tuning)
MODES = ("eager", "snake", "time_major", "compile", "whole")  # time_major: snake + [b, T, C] channels-last convs
# `engine` (no option): the codec as Engine builds it from CodecSwitches: its layout, Snake kernel, compile and cuDNN
# tuning, graphs of at most VOCODER_GRAPH_ROWS rows (more streams decode in pieces of that many)
ENGINE = "engine"


def random_codes(codec: Codec, streams: int, frames: int, device: torch.device) -> torch.Tensor:
    """-> int64 [streams, n, frames]: semantic codes < 4096 in row 0, residual codes in the others."""
    cfg = codec.cfg
    g = torch.Generator().manual_seed(0)
    sem = torch.randint(0, cfg.semantic_codebook_size, (streams, 1, frames), generator=g)
    res = torch.randint(0, cfg.codebook_size, (streams, cfg.num_codebooks - 1, frames), generator=g)
    return torch.cat([sem, res], dim=1).to(device)


def _vocoder(codec: Codec, streams: int, chunk: int, mode: str, graphs: bool, tuned: bool,
             switches: CodecSwitches | None = None) -> Vocoder:
    cuda = next(codec.parameters()).device.type == "cuda"
    graphs = graphs and cuda
    if mode != ENGINE:  # a named mode as switches (its tuning: `tuned`)
        switches = CodecSwitches(compile=mode == "compile", snake_kernel=mode in ("snake", "time_major") and cuda,
                                 cudnn_autotune="graphs" if tuned else "off", channels_last=mode == "time_major")
    if not graphs and switches.cudnn_autotune == "graphs":  # tuned in graph captures: none to tune in
        switches = replace(switches, cudnn_autotune="off")
    graph_rows = min(streams, VOCODER_GRAPH_ROWS) if mode == ENGINE else streams  # the engine's largest graph
    buckets = codec_buckets(tuple(sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, streams})), switches.sparse_rows)
    if switches.compile:  # one compile per row count: only the two the measurement runs
        buckets = (1, graph_rows if graphs else streams)
    voc = Vocoder(codec, streams, 8192, (chunk,), tuple(b for b in buckets if b <= streams), threading.RLock(),
                  lambda frames, seconds: None, lambda stream: None, time_major=switches.channels_last,
                  kv_ring=switches.kv_ring)
    voc.apply(switches)  # as Engine.__init__ does
    if graphs:
        voc.plan_graphs(graph_rows)
    return voc


def measure(codec: Codec, streams: int, chunk: int, seconds: float, mode: str, graphs: bool = True,
            profile: bool = False, switches: CodecSwitches | None = None) -> dict:
    """One mode: warm-up (compile, graph capture), then `seconds` of audio per stream, timed. switches: the engine's
    (mode ENGINE)."""
    base, _, option = mode.partition("+")
    if base == ENGINE and (option or switches is None):
        raise ValueError("codec_bench: the engine mode takes the engine's switches and no +option")
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = option == "cudnn" or (switches is not None and base == ENGINE
                                                           and switches.cudnn_autotune == "process")
    try:
        row = _measure(codec, streams, chunk, seconds, base, graphs, profile, option == "tuned", switches)
        return row | {"mode": mode} | ({"engine": switches.describe()} if base == ENGINE else {})
    finally:
        torch.backends.cudnn.benchmark = old


def _measure(codec: Codec, streams: int, chunk: int, seconds: float, mode: str, graphs: bool,
             profile: bool, tuned: bool, switches: CodecSwitches | None) -> dict:
    dev = next(codec.parameters()).device
    calls = max(2, round(seconds * codec.sample_rate / codec.frame_length / chunk))
    codes = random_codes(codec, streams, chunk * calls, dev)
    slots = list(range(streams))
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if mode == "whole":
        fn = torch.compile(codec.decode, dynamic=False) if cuda else codec.decode

        def step(i: int) -> torch.Tensor:
            return fn(codes[:, :, i * chunk:(i + 1) * chunk])

        voc = None
    else:
        voc = _vocoder(codec, streams, chunk, mode, graphs, tuned, switches)

        def step(i: int) -> torch.Tensor:
            return voc.decode_padded(slots, codes[:, :, i * chunk:(i + 1) * chunk])

    box: dict = {}

    def timed() -> None:
        t0 = time.perf_counter()
        if voc is not None:
            voc.warm_up()
            if graphs and cuda:
                voc.capture()
        for i in range(2):
            step(i)
        sync()
        box["warm_up_s"] = time.perf_counter() - t0
        if voc is not None:
            voc.codec.reset(torch.arange(streams + 1, device=dev))
        t0 = time.perf_counter()
        for i in range(calls):
            step(i)
        sync()
        box["elapsed"] = time.perf_counter() - t0
        if profile and cuda:
            box["profile"] = _profile(lambda: [step(i) for i in range(min(calls, 4))])

    with torch.inference_mode():
        if voc is None:
            timed()
        else:
            try:
                voc.call(timed)
            finally:
                voc.close()
    frames = streams * chunk * calls
    fps = frames / box["elapsed"]
    return {"mode": mode, "streams": streams, "chunk_frames": chunk, "calls": calls, "graphs": graphs and cuda,
            "frames_per_s": round(fps), "audio_s_per_s": round(fps * codec.frame_length / codec.sample_rate, 1),
            "ms_per_call": round(box["elapsed"] / calls * 1e3, 3), "warm_up_s": round(box["warm_up_s"], 2),
            "profile": box.get("profile")}


def _profile(fn) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)
    total = sum(getattr(e, "self_device_time_total", 0) for e in events) or 1
    return [{"name": e.key[:90], "ms": round(e.self_device_time_total / 1e3, 3), "count": e.count,
             "pct": round(100 * e.self_device_time_total / total, 1)} for e in events[:14]]


def run(codec: Codec, streams: list[int], chunk: int, seconds: float, modes: list[str], graphs: bool,
        profile_mode: str | None, out: Path | None, switches: CodecSwitches | None = None) -> list[dict]:
    rows = []
    for n in streams:
        for mode in modes:
            row = measure(codec, n, chunk, seconds, mode, graphs, profile=(mode == profile_mode), switches=switches)
            rows.append(row)
            prof = row.pop("profile")
            print(json.dumps(row), flush=True)
            for p in prof or []:
                print(f"    {p['ms']:9.3f} ms {p['pct']:5.1f}%  x{p['count']:<5} {p['name']}", flush=True)
            row["profile"] = prof
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "codec_bench.json").write_text(json.dumps(rows, indent=2))
    return rows
