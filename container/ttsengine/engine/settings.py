"""Batching settings resolved once from EngineConfig and the loaded model ('auto' values decided here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..compat import compile_supported
from ..config import PREFILL_GROUPS, EngineConfig
from ..errors import ConfigError
from ..model.fused_layer import linear_weight
from ..model.kernels.launch import pdl_runs
from ..model.kernels.small_linear import SMALL_LINEAR_MAX_ROWS
from ..model.kernels.triton_support import triton_available, triton_major
from ..model.loading.checkpoint import Checkpoint
from .device.runner import RunnerConfig
from .device.vocoder import CodecSwitches
from .presets import Preset, by_name, choose, kv_bytes

log = logging.getLogger(__name__)
PAGE_SIZE = 64  # KV positions per page
CUDA_RESERVE = 3 << 30  # bytes kept free for activations, graphs and the codec
# fused kernels with no path but Triton's, and the Triton major version each needs when named (0: any); named where
# that is missing they are dropped with a warning (step_glue's aranges fail in Triton 2.2)
TRITON_ONLY = {"codebook_sampler": 0, "vocab_sampler": 0, "step_glue": 3}


def snake_kernel_usable(config: EngineConfig, cuda: bool) -> bool:
    """The eager codec may run Snake as one Triton kernel: on CUDA, with Triton, unless switched off."""
    return cuda and triton_available() and config.snake_kernel == "auto"


def cudnn_autotune_mode(switch: str, cuda: bool, graphs: bool) -> str:
    """TTS_CUDNN_BENCHMARK -> "off" | "graphs" | "process". cuDNN's autotuning times every algorithm at a
    conv shape's first call and keeps the fastest (the codec: +28% at 64 streams on an H100), but the
    timing synchronizes the GPU, which fails a CUDA graph capture running on another thread. "graphs"
    (auto with CUDA graphs) turns it on only inside the codec's capture windows, which hold the capture
    lock (so no other capture runs) and which voice encoding waits for; a captured graph keeps the tuned
    algorithms. "process" (on) leaves it on everywhere: every new shape is timed, also voice encodings'."""
    if not cuda or switch == "off":
        return "off"
    if switch == "on":
        return "process"
    return "graphs" if graphs else "off"


def codec_channels_last(switch: str, cuda: bool, cudnn_autotune: str) -> bool:
    """TTS_CODEC_CHANNELS_LAST -> whether the streaming codec runs time-major with channels-last convolutions.
    auto: with CUDA where cuDNN tunes the codec's convolutions (its untuned heuristics pick an algorithm ~35x slower
    for two dilated convs at a few rows, on an H100 with torch 2.11: the codec 10x slower at one stream)."""
    if switch in ("on", "off"):
        return switch == "on"
    return cuda and cudnn_autotune != "off"


def graphs_and_compile(config: EngineConfig, cuda: bool) -> tuple[bool, bool]:
    """TTS_CUDA_GRAPHS and TTS_COMPILE -> (CUDA graphs, torch.compile) in effect."""
    graphs = {"on": True, "off": False}.get(config.cuda_graphs, cuda)
    if graphs and not cuda:
        log.warning("TTS_CUDA_GRAPHS=on ignored: no CUDA device")
        graphs = False
    compile_ = {"on": True, "off": False}.get(config.compile, cuda)
    return graphs, compile_ and compile_supported()


def codec_switches(config: EngineConfig, cuda: bool, graphs: bool, compile_: bool) -> CodecSwitches:
    """The codec's switches from the config, given graphs and compile in effect (graphs_and_compile)."""
    codec_compile = compile_ and config.codec_compile == "on"
    tune = cudnn_autotune_mode(config.cudnn_benchmark, cuda, graphs)
    return CodecSwitches(compile=codec_compile, snake_kernel=snake_kernel_usable(config, cuda) and not codec_compile,
                         cudnn_autotune=tune, channels_last=codec_channels_last(config.codec_channels_last, cuda, tune))


def auto_gemv_rows(model, fused: frozenset[str]) -> int:
    """TTS_LAYER_GEMV_ROWS=0: 64 where it was measured faster than cuBLAS (an H100's step with pdl in the fused
    kernels, 16-bit weights: 64 streams 7,700 -> 8,730 frames/s), else 16 (the 64-row tiles' speed on other GPUs,
    without PDL or with int8 weights is unmeasured)."""
    lw = linear_weight(model.layers[0].attention.wqkv)  # (weight, int8 scale or None), None: no plain weight
    sixteen_bit = lw is not None and lw[1] is None and lw[0].dtype in (torch.bfloat16, torch.float16)
    return SMALL_LINEAR_MAX_ROWS if sixteen_bit and "pdl" in fused else 16


def fused_kernels(switch: str, cuda: bool, triton_attention: bool, pdl: bool = False) -> frozenset[str]:
    """TTS_FUSED_KERNELS -> the decode step's fused kernels in use. auto: the measured ones where they are fast
    (CUDA; the Triton ones with Triton, the fast attention with the 16-bit cache its Triton kernel reads; pdl with
    layer_gemv where the device launches programmatic dependents: `pdl`, kernels/launch.pdl_runs). A named
    list is taken as asked, except the samplers without CUDA (Triton's interpreter would crawl): the fast
    attention then runs its reference path (gather + SDPA), which CPU tests use."""
    if switch == "off":
        return frozenset()
    if switch == "auto":
        if not cuda:
            return frozenset()
        # merged_ffn: bucket 2 3.72 -> 3.47 ms, 64 rows 5.34 -> 5.10 ms (H100, torch 2.11, fused_ab.sh); int8/int4
        # linears are left unmerged by merge_inputs. The sampler's tl.sort / tl.cumsum: tested on Triton 3.x (torch
        # 2.2's Triton 2.2 keeps the unfused sampler). layer_gemv (with the fast attention's 16-bit kernel): step at
        # bucket 2 3.52 -> 2.65 ms, one stream 259 -> 324 frames/s (H200, torch 2.11, Triton 3.6)
        # fast_stack stays opt-in: 136 us per fast position at one row vs layer_gemv's 108 (H100, torch 2.11,
        # scripts/device/fast_stack_bench.py): its 21 grid barriers a position cost 1.8 us each
        # pdl (layer_gemv's kernels as programmatic dependents, their 1-2-row tiles holding all of K): the layers of
        # a frame at one row 1,892 -> 1,571 us bf16, 1,874 -> 1,509 int8 (H100, torch 2.11, Triton 3.6,
        # scripts/device/pdl_bench.py); one stream 323 -> 369 frames/s (bench, two device calls)
        # split_attention stays opt-in: one row at 600 positions 16.4 -> 10.6 us a slow layer, at 2,000 42.6 -> 14.1,
        # but at 150 8.1 -> 8.9 (the combine kernel) and 8 streams of the bench 2,320 -> 2,170 frames/s (H100,
        # scripts/device/attention_bench.py, bench): a graph cannot pick by context length
        # vocab_sampler (the slow token without a sort, kernels/vocab_sampler.py): 215 -> 42 us at one row, 1,412 ->
        # 291 us at 64 (scripts/device/vocab_sampler_bench.py); one stream 371 -> 399 frames/s, 64 streams 6,090 ->
        # 6,870 (bench, one device call; H100, torch 2.11, Triton 3.6). Counting only entries above the floor and
        # skipping chunks without window ids or kept entries (stop 40): 64 rows 326 -> 287 us flat, 319 -> 120 peaked
        # step_glue (the step's start and end as two Triton kernels, kernels/step_glue.py, instead of ~35 torch ones):
        # bench 1,8,64, one device call: 455 -> 463, 2,420 -> 2,540, 7,260 -> 7,740 frames/s (H100, torch 2.11)
        triton3 = triton_major() >= 3
        gemv = triton_attention and triton3
        return frozenset({"vocab_scan", "merged_ffn"} | ({"codebook_sampler", "vocab_sampler", "step_glue"} if triton3
                                                         else set())
                         | ({"fast_attention"} if triton_attention else set())
                         | ({"layer_gemv"} if gemv else set()) | ({"pdl"} if gemv and pdl else set()))
    names = frozenset(switch.split(","))
    for name, major in TRITON_ONLY.items():
        if name in names and not (cuda and triton_available() and triton_major() >= major):
            log.warning("TTS_FUSED_KERNELS: %s needs CUDA and Triton%s; its step runs unfused", name,
                        f" >= {major}" if major else "")
            names -= {name}
    return names


def choose_preset(config: EngineConfig, device: torch.device) -> Preset:
    if config.memory_preset != "auto":
        return by_name(config.memory_preset)
    if device.type != "cuda":
        return choose(None, 0)
    return choose(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)


@dataclass(frozen=True)
class BatchSettings:
    runner: RunnerConfig
    max_queue: int
    prefill_tokens: int  # the largest prefill budget per step (engine/control/prefill_budget.py may use less)
    prefix_cache: bool  # share cached prompt prefixes' KV pages (engine/control/prefix_cache.py)
    first_chunk_frames: int
    stream_chunk_frames: int
    cuda_graphs: bool
    overlap_step: bool  # the next step is launched before the last one's frames are read (engine.py _iteration)
    step_priority: bool  # the engine loop's stream at high priority (engine.py _run)
    lazy_graphs: bool  # capture the smallest bucket before ready, the rest later (cuda_graphs.py)
    prefill_graphs: bool  # the prefill as CUDA graphs per padded shape (with cuda_graphs)
    compile: bool  # torch.compile the decode step's units
    codec: CodecSwitches  # how the codec runs: compile, Snake kernel, cuDNN tuning, layout (codec_switches)
    codec_merge_rows: int  # queued codec decodes join into calls of up to this many rows (0: off)
    codec_rounds: bool  # later audio chunks wait for the next codec round (engine/audio_feed.py CodecRounds)
    codec_pinned_copy: bool  # the codec's audio to the host through a pinned buffer, where the codec is on CUDA
    buckets: tuple[int, ...]  # batch sizes a decode step is captured for
    preset: Preset  # the memory preset, with the values in effect (env overrides applied)

    @property
    def codec_compile(self) -> bool:  # torch.compile the streaming codec
        return self.codec.compile

    @property
    def snake_kernel(self) -> bool:  # the eager codec's Snake as one Triton kernel
        return self.codec.snake_kernel

    @property
    def cudnn_autotune(self) -> str:  # "off" | "graphs": while the codec's graphs are captured | "process": everywhere
        return self.codec.cudnn_autotune

    @property
    def codec_channels_last(self) -> bool:  # the streaming codec time-major, channels-last convolutions
        return self.codec.channels_last

    @property
    def warm_buckets(self) -> tuple[int, ...]:
        """The buckets whose step runs before ready (the compiled units they use are compiled then): the first, and
        with compile the first dynamic one (2) after a 1-row bucket, so no compile waits for the first batch of two
        where those buckets run compiled units. (With layer_gemv, steps of up to runner.gemv_rows (16; 64 on an H100)
        rows run Triton kernels, not compiled units: their compile comes with the first bucket above, captured while
        idle or at first use.)"""
        return self.buckets[:2] if self.compile and self.buckets[0] == 1 and self.max_slots > 1 else self.buckets[:1]

    @property
    def max_slots(self) -> int:
        return self.runner.max_slots

    @property
    def kv_positions(self) -> int:
        """KV cache positions shared by all streams (the scratch page excluded)."""
        return (self.runner.num_pages - 1) * self.runner.page_size

    def bucket(self, batch: int) -> int:
        """The smallest bucket that holds `batch` running streams."""
        return next(b for b in self.buckets if b >= batch)

    @staticmethod
    def resolve(config: EngineConfig, ckpt: Checkpoint) -> BatchSettings:
        model = ckpt.model
        device = model.norm.weight.device
        cuda = device.type == "cuda"
        preset = choose_preset(config, device)
        if not 0 <= config.layer_gemv_rows <= SMALL_LINEAR_MAX_ROWS:  # the env's check, for Python callers too
            raise ConfigError(f"layer_gemv_rows={config.layer_gemv_rows}: give 1-{SMALL_LINEAR_MAX_ROWS}, or 0 for "
                              "auto (TTS_LAYER_GEMV_ROWS)")
        if config.prefill_group not in PREFILL_GROUPS:  # likewise
            raise ConfigError(f"prefill_group={config.prefill_group}: give one of "
                              f"{', '.join(map(str, PREFILL_GROUPS))} (TTS_PREFILL_GROUP)")
        max_batch = config.max_batch or preset.max_batch
        utilization = config.gpu_memory_utilization or preset.memory_utilization
        mc = model.cfg
        bytes_per_token = (mc.slow.n_layer * 2 * mc.slow.n_local_heads * mc.slow.head_dim
                           * model.norm.weight.element_size())
        tokens = config.kv_cache_tokens
        if not tokens:
            want = max(max_batch * preset.positions_per_stream, mc.cache_len)  # room for one full-length stream
            if cuda:
                free, total = torch.cuda.mem_get_info(device)
                room = kv_bytes(total, free, torch.cuda.memory_reserved(device), CUDA_RESERVE, utilization)
                room //= config.kv_share  # engines sharing this device (placement.py) take their part of it
                tokens = min(want, room // bytes_per_token)
                if tokens < mc.cache_len:
                    raise ConfigError(
                        f"TTS_GPU_MEMORY_UTILIZATION={utilization:g} of {total / 1e9:.1f} GB leaves room for "
                        f"{tokens} KV positions ({free / 1e9:.1f} GB free, {CUDA_RESERVE / 1e9:.1f} GB reserved); one "
                        f"stream needs {mc.cache_len}: raise it, or set TTS_KV_CACHE_TOKENS")
            else:
                tokens = min(want, (2 << 30) // bytes_per_token)
        elif tokens < mc.cache_len:  # served, but each request is capped (the planner's capacity guard says so)
            log.warning("TTS_KV_CACHE_TOKENS=%d holds less than one full-length stream (%d positions): long "
                        "requests will be refused", tokens, mc.cache_len)
        tokens = max(tokens, PAGE_SIZE)
        num_pages = -(-tokens // PAGE_SIZE) + 1  # + the scratch page
        log.info("memory preset %s: %d streams, KV cache %d positions in %d pages, %.2f GB (memory share %g)",
                 preset.name, max_batch, (num_pages - 1) * PAGE_SIZE, num_pages,
                 num_pages * PAGE_SIZE * bytes_per_token / 1e9, utilization)
        graphs, compile_ = graphs_and_compile(config, cuda)
        codec = codec_switches(config, cuda, graphs, compile_)
        buckets = []
        # compiled units are dynamic from 2 (size 1 specialises): a 1-row bucket is a second variant of each; worth
        # it for the lone stream (one stream 407 -> 460 frames/s with an engine sized 1 vs 64, H100, bench, call 1
        # of stop 34): at 2 rows the GEMVs, attention, samplers and codec compute a padding row
        b = 2 if compile_ and max_batch > 1 and not config.one_row_bucket else 1
        while b < max_batch:
            buckets.append(b)
            b *= 2
        buckets.append(max_batch)
        # the kernel's dot products are 16-bit; an fp32 cache keeps the exact path
        triton_attention = cuda and triton_available() and model.norm.weight.element_size() == 2
        fused = fused_kernels(config.fused_kernels, cuda, triton_attention, pdl_runs(device))
        runner = RunnerConfig(max_slots=max_batch, page_size=PAGE_SIZE, num_pages=num_pages,
                              penalty_window=ckpt.family.RULES.penalty_window, triton_attention=triton_attention,
                              fused=fused, gemv_rows=config.layer_gemv_rows or auto_gemv_rows(model, fused),
                              prefill_group=config.prefill_group)
        return BatchSettings(runner=runner, max_queue=config.max_queue or 2 * max_batch,
                             prefill_tokens=config.prefill_tokens, prefix_cache=config.prefix_cache,
                             first_chunk_frames=config.first_chunk_frames,
                             stream_chunk_frames=config.stream_chunk_frames, cuda_graphs=graphs,
                             overlap_step={"on": True, "off": False}.get(config.overlap_step, cuda),
                             step_priority=config.step_priority and cuda,
                             lazy_graphs=config.lazy_graphs, prefill_graphs=graphs and config.prefill_graphs != "off",
                             compile=compile_, codec=codec,
                             codec_merge_rows=0 if config.codec_merge == "off" else max_batch,
                             codec_rounds=config.codec_rounds != "off",
                             codec_pinned_copy=config.codec_pinned_copy,
                             buckets=tuple(buckets),
                             preset=replace(preset, max_batch=max_batch, memory_utilization=utilization))
