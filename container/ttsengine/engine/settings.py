"""Batching settings resolved once from EngineConfig and the loaded model ('auto' values decided here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..model.checkpoint import Checkpoint
from ..model.paged_attention import triton_available
from .runner import RunnerConfig

log = logging.getLogger(__name__)
PAGE_SIZE = 64  # KV positions per page
CUDA_RESERVE = 3 << 30  # bytes kept free for activations, graphs and the codec


@dataclass(frozen=True)
class BatchSettings:
    runner: RunnerConfig
    max_queue: int
    prefill_tokens: int
    first_chunk_frames: int
    stream_chunk_frames: int
    cuda_graphs: bool
    compile: bool
    buckets: tuple[int, ...]  # batch sizes a decode step is captured for

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
        buckets = []
        b = 1
        while b < max_batch:
            buckets.append(b)
            b *= 2
        buckets.append(max_batch)
        runner = RunnerConfig(max_slots=max_batch, page_size=PAGE_SIZE, num_pages=num_pages,
                              penalty_window=ckpt.family.RULES.penalty_window,
                              triton_attention=cuda and triton_available())
        return BatchSettings(runner=runner, max_queue=config.max_queue or 2 * max_batch,
                             prefill_tokens=config.prefill_tokens, first_chunk_frames=config.first_chunk_frames,
                             stream_chunk_frames=config.stream_chunk_frames, cuda_graphs=graphs, compile=compile_,
                             buckets=tuple(buckets))
