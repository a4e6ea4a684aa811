"""RunPod's serverless GPU pools and the streams our worker takes on each.

A worker takes as many jobs at once as its engine has stream slots (handlers/runpod: the concurrency
modifier returns the engine's max_streams unless RUNPOD_CONCURRENCY is set), and the engine sizes its slots
from the GPU by the memory presets (container/ttsengine/engine/presets.py). A pool mixes GPUs, so a pool's
streams are its smallest GPU's. Request-count scaling divides the jobs (queued + running) by `scalerValue`,
so that value must not exceed the streams of the smallest pool the endpoint may land on: a larger one
leaves jobs queued with no worker to start.

The pools' GPUs are RunPod's list (docs.runpod.io, "GPU types", GPU pools); tests/infra check that each
number here is what presets.choose() picks for those GPUs. These are preset values (scaled from the H100
measurement), not measured per GPU.
"""

from __future__ import annotations

# pool -> ((CUDA device name, nominal memory in GB), ...)
POOL_GPUS: dict[str, tuple[tuple[str, int], ...]] = {
    "AMPERE_16": (("NVIDIA RTX A4000", 16), ("NVIDIA RTX 4000 Ada Generation", 20),
                  ("NVIDIA RTX 2000 Ada Generation", 16)),
    "AMPERE_24": (("NVIDIA RTX A4500", 20), ("NVIDIA RTX A5000", 24), ("NVIDIA GeForce RTX 3090", 24)),
    "ADA_24": (("NVIDIA L4", 24), ("NVIDIA GeForce RTX 4090", 24)),
    "ADA_32_PRO": (("NVIDIA GeForce RTX 5090", 32),),
    "AMPERE_48": (("NVIDIA A40", 48), ("NVIDIA RTX A6000", 48)),
    "ADA_48_PRO": (("NVIDIA L40S", 48), ("NVIDIA L40", 48), ("NVIDIA RTX 6000 Ada Generation", 48)),
    "AMPERE_80": (("NVIDIA A100 80GB PCIe", 80), ("NVIDIA A100-SXM4-80GB", 80)),
    "ADA_80_PRO": (("NVIDIA H100 PCIe", 80), ("NVIDIA H100 80GB HBM3", 80), ("NVIDIA H100 NVL", 94)),
    "HOPPER_141": (("NVIDIA H200", 141),),
}

# pool -> stream slots of its smallest GPU (the memory presets; a 20 GB card reports a little under 20 GiB,
# so it falls to the small preset)
POOL_STREAMS: dict[str, int] = {
    "AMPERE_16": 16,
    "AMPERE_24": 16,
    "ADA_24": 48,
    "ADA_32_PRO": 96,
    "AMPERE_48": 96,
    "ADA_48_PRO": 96,
    "AMPERE_80": 128,
    "ADA_80_PRO": 256,
    "HOPPER_141": 256,
}


def worker_streams(gpu_ids: str, env: dict[str, str]) -> int:
    """Jobs the smallest worker of an endpoint takes at once: RUNPOD_CONCURRENCY when set, else TTS_MAX_BATCH
    when set (it replaces the preset's slots), else the smallest pool's slots. Raises KeyError for a pool not
    in the table, ValueError for a value that is not a number."""
    for key in ("RUNPOD_CONCURRENCY", "TTS_MAX_BATCH"):
        value = int(env.get(key) or 0)
        if value > 0:
            return value
    return min(POOL_STREAMS[p.strip()] for p in gpu_ids.split(",") if p.strip())
