"""Memory presets: per GPU class, how many streams the engine batches and how much of the GPU it may use.

A preset is picked once at start from the CUDA device's name and memory (TTS_MEMORY_PRESET names one
instead); TTS_MAX_BATCH, TTS_KV_CACHE_TOKENS and TTS_GPU_MEMORY_UTILIZATION override its values. The
batch sizes are the streams a GPU keeps near 1.2x real time (the `h100` preset measured with the real
S1-mini shapes; the others scaled from it by memory bandwidth and bf16 throughput, to be confirmed on each
GPU; docs/performance.md, "Engine scheduling"): more slots than that would slow every stream instead of queueing the
extra requests. The KV
pool then takes `positions_per_stream` per slot, within `memory_utilization` of the GPU's memory
(vLLM's meaning: the engine's share of the whole GPU, weights and workspace included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Preset:
    name: str
    max_batch: int  # decode-step slots (CUDA graph buckets: powers of two up to it)
    positions_per_stream: int  # KV positions sized per slot (a stream's prompt + frames; 2048 = the full context)
    memory_utilization: float = 0.85  # fraction of the GPU's total memory the engine may use

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Rule:
    preset: Preset
    names: tuple[str, ...]  # any of these in the lower-cased device name
    min_gb: float = 0.0  # and at least this much memory (A100 40 vs 80 GB)


GB = 1 << 30
CPU = Preset("cpu", 8, 2048, 1.0)
_RULES = (
    _Rule(Preset("h200", 256, 2048), ("h200", "gh200")),
    _Rule(Preset("h100", 256, 2048), ("h100", "h800")),
    _Rule(Preset("a100-80gb", 128, 2048), ("a100", "a800"), min_gb=60),
    _Rule(Preset("a100-40gb", 128, 1536), ("a100", "a800")),
    _Rule(Preset("l40s", 128, 1536), ("l40s", "l40")),
    _Rule(Preset("rtx-5090", 96, 1536), ("5090",)),
    _Rule(Preset("rtx-4090", 64, 1024), ("4090",)),
    _Rule(Preset("a10g", 64, 1024), ("a10g", "a10")),
    _Rule(Preset("l4", 48, 1024), ("l4",)),
)
# unknown GPUs: by memory
_BY_MEMORY = ((100, Preset("gpu-100gb", 256, 2048)), (60, Preset("gpu-60gb", 128, 2048)),
              (36, Preset("gpu-36gb", 96, 1536)), (20, Preset("gpu-20gb", 64, 1024)),
              (0, Preset("gpu-small", 16, 1024)))
_ALL = tuple(r.preset for r in _RULES) + tuple(p for _, p in _BY_MEMORY) + (CPU,)
NAMES = tuple(p.name for p in _ALL)


def by_name(name: str) -> Preset:
    for p in _ALL:
        if p.name == name:
            return p
    raise ConfigError(f"TTS_MEMORY_PRESET={name!r} is not one of auto, {', '.join(NAMES)}")


def choose(device_name: str | None, total_bytes: int) -> Preset:
    """device_name: the CUDA device's name (None: CPU); total_bytes: its memory."""
    if device_name is None:
        return CPU
    name, gb = device_name.lower(), total_bytes / GB
    for rule in _RULES:
        if any(n in name for n in rule.names) and gb >= rule.min_gb:
            return rule.preset
    return next(p for floor, p in _BY_MEMORY if gb >= floor)


def kv_bytes(total: int, free: int, own: int, reserve: int, utilization: float) -> int:
    """Bytes the KV pool may take: the engine's share of the GPU (total x utilization) less what this process
    already holds (weights) and a reserve for activations, graphs and the codec; never more than is free
    (other processes' memory) less the reserve."""
    return max(0, min(int(total * utilization) - own - reserve, free - reserve))
