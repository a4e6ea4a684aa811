"""Batching settings resolved once from EngineConfig and the loaded model ('auto' values decided here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..compat import compile_supported, precompile_supported
from ..config import PREFILL_GROUPS, EngineConfig
from ..errors import ConfigError
from ..model.fused_layer import linear_weight
from ..model.kernels.launch import pdl_runs
from ..model.kernels.small_linear import SMALL_LINEAR_MAX_ROWS
from ..model.kernels.triton_support import triton_available, triton_major
from ..model.loading.checkpoint import Checkpoint
from . import features
from .control.goodput import ADMIT_RTF
from .device.runner import RunnerConfig
from .device.vocoder import CodecSwitches
from .features import Platform
from .presets import Preset, by_name, choose, kv_bytes

log = logging.getLogger(__name__)
PAGE_SIZE = 64  # KV positions per page
CUDA_RESERVE = 3 << 30  # bytes kept free for activations, graphs and the codec


def platform(device: torch.device, sixteen_bit: bool) -> Platform:
    """The facts the speed features' probes read (engine/features.py), for a model of 16-bit weights or not."""
    return Platform(cuda=device.type == "cuda", triton=triton_available(), triton_major=triton_major(),
                    sixteen_bit=sixteen_bit, pdl=pdl_runs(device), compile=compile_supported(),
                    precompile=precompile_supported())


def features_on(config: EngineConfig, where: Platform) -> frozenset[str]:
    """TTS_FEATURES on this platform: the features in effect; one warning for each asked-for one that cannot run."""
    try:
        resolved = features.resolve(config.features, where)
    except ValueError as e:  # the env's check, for Python callers too
        raise ConfigError(f"features={config.features!r}: {e} (TTS_FEATURES)") from None
    for name, why in resolved.refused:
        log.warning("TTS_FEATURES: %s %s; it is off", name, why)
    return resolved.on


def snake_kernel_usable(config: EngineConfig, cuda: bool) -> bool:
    """The eager codec may run Snake as one Triton kernel: on CUDA, with Triton, unless switched off (what a codec
    whose compile failed falls back to)."""
    return cuda and triton_available() and not features.switched_off(config.features, features.SNAKE_KERNEL)


def cudnn_autotune_mode(on: frozenset[str]) -> str:
    """The cuDNN features -> "off" | "graphs" | "process". cuDNN's autotuning times every algorithm at a
    conv shape's first call and keeps the fastest (measured faster codec: docs/performance.md, "Codec"), but the
    timing synchronizes the GPU, which fails a CUDA graph capture running on another thread. "graphs"
    (cudnn_tuning, with CUDA graphs) turns it on only inside the codec's capture windows, which hold the capture
    lock (so no other capture runs) and which voice encoding waits for; a captured graph keeps the tuned
    algorithms. "process" (cudnn_benchmark) leaves it on everywhere: every new shape is timed, also voice
    encodings'."""
    if features.CUDNN_BENCHMARK in on:
        return "process"
    return "graphs" if features.CUDNN_TUNING in on else "off"


def codec_switches(on: frozenset[str]) -> CodecSwitches:
    """How the codec runs, from the features in effect (features_on). The channels-last layout is on by default
    only where cuDNN tunes the codec's convolutions: its untuned heuristics pick an algorithm ~35x slower for two
    dilated convs at a few rows (the codec far slower at one stream: docs/performance.md, "Codec")."""
    return CodecSwitches(compile=features.CODEC_COMPILE in on, snake_kernel=features.SNAKE_KERNEL in on,
                         cudnn_autotune=cudnn_autotune_mode(on), channels_last=features.CODEC_CHANNELS_LAST in on,
                         kv_ring=features.CODEC_KV_RING in on, sparse_rows=features.CODEC_SPARSE_ROWS in on,
                         own_convs=features.CODEC_OWN_CONVS in on, fused_convs=features.CODEC_FUSED_CONVS in on)


def codec_buckets(buckets: tuple[int, ...], sparse: bool) -> tuple[int, ...]:
    """The row counts codec calls are padded to: the engine's batch buckets, or with codec_sparse_rows the powers of 4
    among them and the largest. Each (rows, chunk size) is a CUDA graph whose capture tunes cuDNN per shape (~1-2 s
    each: issue 44); 1, 4, 16, 64 halve them, at up to 4x padded rows for mid-sized calls."""
    if not sparse:
        return buckets
    return tuple(b for b in buckets if b == buckets[-1] or (b & (b - 1) == 0 and b.bit_length() % 2 == 1))


def auto_gemv_rows(model, fused: frozenset[str]) -> int:
    """TTS_LAYER_GEMV_ROWS=0: 64 where it was measured faster than cuBLAS (with pdl in the fused kernels and
    16-bit weights: docs/performance.md, "Layer GEMV rows"), else 16 (the 64-row tiles' speed on other GPUs,
    without PDL or with int8 weights is unmeasured)."""
    lw = linear_weight(model.layers[0].attention.wqkv)  # (weight, int8 scale or None), None: no plain weight
    sixteen_bit = lw is not None and lw[1] is None and lw[0].dtype in (torch.bfloat16, torch.float16)
    return SMALL_LINEAR_MAX_ROWS if sixteen_bit and features.PDL in fused else 16


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
    admit_rtf: float  # goodput admission's floor (control/goodput.py); 0 = off
    admit_wait: float  # with admission on, the longest expected wait for a slot a new stream is queued for
    prefill_tokens: int  # the largest prefill budget per step (engine/control/prefill_budget.py may use less)
    prefix_cache: bool  # share cached prompt prefixes' KV pages (engine/control/prefix_cache.py)
    first_chunk_frames: int
    stream_chunk_frames: int
    cuda_graphs: bool
    overlap_step: bool  # the next step is launched before the last one's frames are read (engine.py _iteration)
    step_priority: bool  # the engine loop's stream at high priority (engine.py _run)
    segment_slack: bool  # the queue by deadline: a request's slack_s lets those due earlier go first (scheduler.py)
    slack_prefill: bool  # a step may prefill past the real-time budget while listeners have audio ahead
    lazy_graphs: bool  # capture the smallest bucket before ready, the rest later (cuda_graphs.py)
    prefill_graphs: bool  # the prefill as CUDA graphs per padded shape (with cuda_graphs)
    compile: bool  # torch.compile the decode step's units
    codec: CodecSwitches  # how the codec runs: compile, Snake kernel, cuDNN tuning, layout (codec_switches)
    codec_merge_rows: int  # queued codec decodes join into calls of up to this many rows (0: off)
    codec_rounds: bool  # later audio chunks wait for the next codec round (engine/audio_feed.py CodecRounds)
    codec_pinned_copy: bool  # the codec's audio to the host through a pinned buffer, where the codec is on CUDA
    buckets: tuple[int, ...]  # batch sizes a decode step is captured for
    preset: Preset  # the memory preset, with the values in effect (env overrides applied)
    features: frozenset[str] = frozenset()  # the speed features in effect (engine/features.py); the fields above
    # that switch one are read from it

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
        where those buckets run compiled units. (With layer_gemv, steps of up to runner.gemv_rows (16, or 64 with PDL)
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
        if config.admit_rtf is not None and not 0 <= config.admit_rtf <= 100:  # likewise
            raise ConfigError(f"admit_rtf={config.admit_rtf}: give 0 (off) to 100, or None for auto (TTS_ADMIT_RTF)")
        if not 0 <= config.admit_wait <= 3600:  # likewise
            raise ConfigError(f"admit_wait={config.admit_wait}: give 0 (no waiting) to 3600 seconds (TTS_ADMIT_WAIT)")
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
        sixteen_bit = model.norm.weight.element_size() == 2
        on = features_on(config, platform(device, sixteen_bit))
        graphs, compile_ = features.CUDA_GRAPHS in on, features.COMPILE in on
        buckets = []
        # compiled units are dynamic from 2 (size 1 specialises): a 1-row bucket is a second variant of each; worth
        # it for the lone stream (measured faster: docs/performance.md, "Engine scheduling"): at 2 rows the GEMVs,
        # attention, samplers and codec compute a padding row
        b = 2 if compile_ and max_batch > 1 and features.ONE_ROW_BUCKET not in on else 1
        while b < max_batch:
            buckets.append(b)
            b *= 2
        buckets.append(max_batch)
        # the kernel's dot products are 16-bit; an fp32 cache keeps the exact path
        triton_attention = cuda and triton_available() and sixteen_bit
        fused = frozenset(n for n in on if n in features.KERNELS)
        runner = RunnerConfig(max_slots=max_batch, page_size=PAGE_SIZE, num_pages=num_pages,
                              penalty_window=ckpt.family.RULES.penalty_window, triton_attention=triton_attention,
                              fused=fused, gemv_rows=config.layer_gemv_rows or auto_gemv_rows(model, fused),
                              prefill_group=config.prefill_group)
        admit_rtf = config.admit_rtf if config.admit_rtf is not None else ADMIT_RTF if cuda else 0.0
        return BatchSettings(runner=runner, max_queue=config.max_queue or 2 * max_batch, admit_rtf=admit_rtf,
                             admit_wait=config.admit_wait,
                             prefill_tokens=config.prefill_tokens, prefix_cache=config.prefix_cache,
                             first_chunk_frames=config.first_chunk_frames,
                             stream_chunk_frames=config.stream_chunk_frames, cuda_graphs=graphs,
                             overlap_step=features.OVERLAP_STEP in on, step_priority=features.STEP_PRIORITY in on,
                             segment_slack=features.SEGMENT_SLACK in on, slack_prefill=features.SLACK_PREFILL in on,
                             lazy_graphs=features.LAZY_GRAPHS in on, prefill_graphs=features.PREFILL_GRAPHS in on,
                             compile=compile_, codec=codec_switches(on),
                             codec_merge_rows=max_batch if features.CODEC_MERGE in on else 0,
                             codec_rounds=features.CODEC_ROUNDS in on,
                             codec_pinned_copy=features.CODEC_PINNED_COPY in on,
                             buckets=tuple(buckets),
                             preset=replace(preset, max_batch=max_batch, memory_utilization=utilization), features=on)
