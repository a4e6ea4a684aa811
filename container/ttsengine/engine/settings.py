"""Batching settings resolved once from EngineConfig and the loaded model ('auto' values decided here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..compat import compile_supported
from ..config import EngineConfig
from ..model.checkpoint import Checkpoint
from ..model.kernels.triton_support import triton_available
from .runner import RunnerConfig

log = logging.getLogger(__name__)
PAGE_SIZE = 64  # KV positions per page
CUDA_RESERVE = 3 << 30  # bytes kept free for activations, graphs and the codec


def snake_kernel_usable(config: EngineConfig, cuda: bool) -> bool:
    """The eager codec may run Snake as one Triton kernel: on CUDA, with Triton, unless switched off."""
    return cuda and triton_available() and config.snake_kernel == "auto"


@dataclass(frozen=True)
class BatchSettings:
    runner: RunnerConfig
    max_queue: int
    prefill_tokens: int
    first_chunk_frames: int
    stream_chunk_frames: int
    cuda_graphs: bool
    lazy_graphs: bool  # capture the smallest bucket before ready, the rest later (cuda_graphs.py)
    compile: bool  # torch.compile the decode step's units
    codec_compile: bool  # torch.compile the streaming codec
    snake_kernel: bool  # the eager codec's Snake as one Triton kernel
    cudnn_benchmark: bool  # cuDNN autotunes its convolutions (the codec) per shape
    codec_merge_rows: int  # queued codec decodes join into calls of up to this many rows (0: off)
    buckets: tuple[int, ...]  # batch sizes a decode step is captured for

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
        max_batch = config.max_batch or (256 if cuda else 8)
        mc = model.cfg
        bytes_per_token = (mc.slow.n_layer * 2 * mc.slow.n_local_heads * mc.slow.head_dim
                           * model.norm.weight.element_size())
        tokens = config.kv_cache_tokens
        if not tokens:
            want = max(max_batch * 2048, mc.cache_len)  # room for at least one full-length stream
            if cuda:
                free, _ = torch.cuda.mem_get_info(device)
                tokens = min(want, int(max(free - CUDA_RESERVE, 0) * 0.6) // bytes_per_token)
            else:
                tokens = min(want, (2 << 30) // bytes_per_token)
        tokens = max(tokens, PAGE_SIZE)
        num_pages = -(-tokens // PAGE_SIZE) + 1  # + the scratch page
        log.info("KV cache: %d positions in %d pages, %.2f GB", (num_pages - 1) * PAGE_SIZE, num_pages,
                 num_pages * PAGE_SIZE * bytes_per_token / 1e9)
        graphs = {"on": True, "off": False}.get(config.cuda_graphs, cuda)
        if graphs and not cuda:
            log.warning("TTS_CUDA_GRAPHS=on ignored: no CUDA device")
            graphs = False
        compile_ = {"on": True, "off": False}.get(config.compile, cuda)
        compile_ = compile_ and compile_supported()
        codec_compile = compile_ and config.codec_compile == "on"
        snake_kernel = snake_kernel_usable(config, cuda) and not codec_compile
        # auto = off: cuDNN's autotuning synchronizes, which fails a CUDA graph capture running on the other
        # thread (the engine and the codec capture lazily while serving; voice encoding runs any time)
        cudnn_benchmark = config.cudnn_benchmark == "on" and cuda
        buckets = []
        b = 2 if compile_ and max_batch > 1 else 1  # compiled graphs are dynamic from 2 (size 1 specialises)
        while b < max_batch:
            buckets.append(b)
            b *= 2
        buckets.append(max_batch)
        runner = RunnerConfig(max_slots=max_batch, page_size=PAGE_SIZE, num_pages=num_pages,
                              penalty_window=ckpt.family.RULES.penalty_window,
                              # the kernel's dot products are 16-bit; an fp32 cache keeps the exact path
                              triton_attention=cuda and triton_available() and model.norm.weight.element_size() == 2)
        return BatchSettings(runner=runner, max_queue=config.max_queue or 2 * max_batch,
                             prefill_tokens=config.prefill_tokens, first_chunk_frames=config.first_chunk_frames,
                             stream_chunk_frames=config.stream_chunk_frames, cuda_graphs=graphs,
                             lazy_graphs=config.lazy_graphs, compile=compile_, codec_compile=codec_compile,
                             snake_kernel=snake_kernel, cudnn_benchmark=cudnn_benchmark,
                             codec_merge_rows=0 if config.codec_merge == "off" else max_batch,
                             buckets=tuple(buckets))
