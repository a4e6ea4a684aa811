"""Where each engine runs: TTS_DEVICES and TTS_TOPOLOGY -> one engine config per engine. No torch here
(the caller passes how many CUDA devices it sees), so the rules are tested on any machine.

replicas: one whole engine (DualAR + codec) per listed device; a device listed twice holds two engines,
which split its memory share. split: devices pair up in order (cuda:0,cuda:1 -> the DualAR on cuda:0 and
its codec on cuda:1): the decode steps of one GPU feed the codec of another (Fish Audio's own split).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..config import EngineConfig
from ..errors import ConfigError


@dataclass(frozen=True)
class Placement:
    device: str  # the DualAR's (the decode step, the KV cache)
    codec_device: str  # the codec's (streaming decode, voice encoding)


def device_list(config: EngineConfig, cuda_count: int) -> list[str]:
    """TTS_DEVICES as device names. auto: TTS_DEVICE when that names one, else every visible GPU, else the CPU."""
    if config.devices == "auto":
        if config.device != "auto":
            return [_name(config.device, cuda_count, "TTS_DEVICE")]
        return [f"cuda:{i}" for i in range(cuda_count)] or ["cpu"]
    return [_name(d, cuda_count, "TTS_DEVICES") for d in config.devices.split(",")]


def _name(device: str, cuda_count: int, var: str) -> str:
    if device == "cpu":
        return device
    index = 0 if device == "cuda" else int(device.removeprefix("cuda:"))
    if cuda_count == 0:
        raise ConfigError(f"{var}: {device} asked for, but CUDA is not available on this machine")
    if index >= cuda_count:
        raise ConfigError(f"{var}: {device} asked for, but this machine has {cuda_count} CUDA device(s) "
                          f"(cuda:0..cuda:{cuda_count - 1})")
    return f"cuda:{index}"


def placements(config: EngineConfig, cuda_count: int) -> list[Placement]:
    devices = device_list(config, cuda_count)
    if config.topology == "replicas":
        return [Placement(d, d) for d in devices]
    if len(devices) % 2:
        raise ConfigError(f"TTS_TOPOLOGY=split pairs devices (DualAR, codec): {len(devices)} listed "
                          f"({','.join(devices)}); give an even number in TTS_DEVICES")
    return [Placement(devices[i], devices[i + 1]) for i in range(0, len(devices), 2)]


def engine_configs(config: EngineConfig, cuda_count: int) -> list[EngineConfig]:
    """One config per engine, in TTS_DEVICES order: its device, its codec's device and its share of a device
    that holds several (kv_share counts the engines on that device still to size their KV cache: the
    engines are built in this order, each taking its part of what the ones before it left)."""
    out = []
    left = Counter(p.device for p in placements(config, cuda_count))
    for p in placements(config, cuda_count):
        out.append(config.with_(device=p.device, codec_device=p.codec_device, kv_share=left[p.device]))
        left[p.device] -= 1
    return out


def process_configs(config: EngineConfig, cuda_count: int) -> list[EngineConfig]:
    """One config per engine process (TTS_ENGINE_PROCESS=on): the engines that share a GPU stay in one process (they
    size their KV cache together), a split pair too; every other GPU, and every CPU engine, gets a process of its own.
    In TTS_DEVICES order; each config's `devices` lists its engines' devices as engine_configs reads them, and the
    fail_engine test hook is renumbered to the engine's place in its process."""
    found = placements(config, cuda_count)
    groups: list[list[int]] = []  # engine indices per process
    home: dict[str, int] = {}  # a GPU -> its process
    for i, p in enumerate(found):
        gpus = [d for d in (p.device, p.codec_device) if d != "cpu"]
        g = next((home[d] for d in gpus if d in home), None)
        if g is None:
            g = len(groups)
            groups.append([])
        groups[g].append(i)
        home.update({d: g for d in gpus})
    failing, _, at = config.fail_engine.partition("@")
    out = []
    for members in groups:
        names = [d for i in members for d in ((found[i].device,) if config.topology == "replicas"
                                               else (found[i].device, found[i].codec_device))]
        fail = f"{members.index(int(failing))}@{at}" if failing.isdigit() and int(failing) in members else ""
        out.append(config.with_(devices=",".join(names), device="auto", fail_engine=fail))
    return out


@dataclass(frozen=True)
class GpuView:
    """What one engine process is shown of the machine's GPUs (feature own_gpu_view)."""
    visible: str | None  # its CUDA_VISIBLE_DEVICES (None: the front's, inherited; nothing renamed)
    devices: str  # its config's devices, named as it sees them
    names: dict[str, str]  # a device as it sees it -> the name the front and its users know


def gpu_view(devices: str, inherited: str | None) -> GpuView:
    """One engine process's GPUs shown to it alone, numbered from cuda:0 in order of first use: `devices` is its
    config's list as process_configs names them (cuda:N, cpu); `inherited` the front's CUDA_VISIBLE_DEVICES, whose
    entries the indices count (unset: the physical order). Why: a compiled decode-step variant's guards check the
    device index (engine/device/compile/precompiled.py), so an engine on cuda:1 could not use what `warm` or a
    worker on cuda:0 put in the kernel cache and traced its own (seconds of a settled start: docs/performance.md);
    seeing its GPU as cuda:0, every process shares one set. Names it cannot map (auto, a bare cuda, an index past
    the inherited list) leave the view as inherited: the engine then reports what it reports today."""
    listed = devices.split(",")
    if not all(d == "cpu" or (d.startswith("cuda:") and d[5:].isdigit()) for d in listed):
        return GpuView(None, devices, {})
    order = list(dict.fromkeys(int(d[5:]) for d in listed if d != "cpu"))
    entries = None if inherited is None else [e.strip() for e in inherited.split(",") if e.strip()]
    if not order or (entries is not None and max(order) >= len(entries)):
        return GpuView(None, devices, {})
    seen = {f"cuda:{k}": f"cuda:{i}" for i, k in enumerate(order)}
    return GpuView(visible=",".join(str(k) if entries is None else entries[k] for k in order),
                   devices=",".join(seen.get(d, d) for d in listed), names={v: k for k, v in seen.items()})
