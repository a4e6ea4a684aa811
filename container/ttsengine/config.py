"""Configuration: frozen dataclasses built once at the edge, each described by a table of environment
variables that one function (`read`) parses.

This is the only module of the core that reads the environment. Every variable is listed once, in the
tables below (and in docs/configuration.md, which a test keeps in sync); `dev=True` marks the experiment knobs
the doc lists under "Developer settings". Every switch takes auto | on | off (1/0, true/false and yes/no
too); the speed features are one list, TTS_FEATURES, over the defaults of their registry (engine/features.py).
Platform defaults (RunPod's network volume, SageMaker's body limit) are not named here: the adapters pass them
to `read` as `defaults`, below the environment.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TypeVar

from .engine import features
from .errors import ConfigError

log = logging.getLogger(__name__)
DEFAULT_MODEL_DIR = "/opt/ml/model"  # SageMaker's path, used everywhere
C = TypeVar("C")


# ---- kinds of value: how a variable's text becomes a value, and which values are allowed --------------------
@dataclass(frozen=True)
class Kind:
    parse: Callable[[str], object]  # stripped, non-empty text -> value; ValueError when it is not of this kind
    expected: str  # what `parse` wants, for the error message
    check: Callable[[object], str | None] = lambda value: None  # -> why a value is refused (None: allowed)


def _integer(text: str) -> int:
    return int(text)


def integer(lo: int, hi: int | None = None, note: str = "") -> Kind:
    def check(value) -> str | None:
        if hi is not None and not lo <= value <= hi:
            return f"{value} is outside {lo}..{hi}{note}"
        return f"must be >= {lo}{note}" if value < lo else None

    return Kind(_integer, "an integer", check)


def integer_of(*allowed: int) -> Kind:
    """One of the integers `allowed`."""
    words = ", ".join(map(str, allowed))
    return Kind(_integer, f"one of {words}",
                lambda value: None if value in allowed else f"{value} is not one of {words}")


def positive_number() -> Kind:
    """A finite number > 0: `inf` would read as "no limit" and break what the limit sizes (a reference's sample
    count, a timeout's deadline); `nan` compares false with everything."""
    def check(value) -> str | None:
        if not math.isfinite(value):
            return f"{value} is not a finite number (give seconds, e.g. 30)"
        return None if value > 0 else "must be > 0"

    return Kind(float, "a number", check)


def number_or_off(unit: str = "seconds") -> Kind:
    """A finite number >= 0, where 0 switches the limit off (the slow-client limits: an operator behind a proxy
    that enforces its own may want ours gone, and "off" is written as 0, not implied by a huge number)."""
    def check(value) -> str | None:
        if not math.isfinite(value):
            return f"{value} is not a finite number (give {unit}, or 0 for no limit)"
        return None if value >= 0 else "must be >= 0 (0: no limit)"

    return Kind(float, "a number", check)


def seconds_up_to(top: float) -> Kind:
    """Seconds in 0..top (0 is a meaningful setting, not "off")."""
    def check(value) -> str | None:
        if not math.isfinite(value) or not 0 <= value <= top:
            return f"{value} is not a number of seconds in 0..{top:g}"
        return None

    return Kind(float, "a number", check)


def rtf_or_auto() -> Kind:
    """auto (None: decided at start from the device) or a real-time factor in 0..100, 0 switching the test off."""
    def parse(text: str) -> float | None:
        return None if text.lower() == "auto" else float(text)

    def check(value) -> str | None:
        if value is None:
            return None
        if not math.isfinite(value) or not 0 <= value <= 100:
            return f"{value} is not auto or a number in 0..100 (0: off)"
        return None

    return Kind(parse, "auto or a number", check)


def _api_key(value) -> str | None:
    """Printable ASCII only: HTTP headers carry bytes, and clients encode other characters differently (Latin-1
    or UTF-8), so a key with them would match for some clients and lock the others out of every route."""
    bad = next((c for c in value if not (c.isascii() and c.isprintable())), None)
    return None if bad is None else f"contains {bad!r}: use printable ASCII characters only"


# the memory presets' names (engine/presets.py NAMES; a test keeps the two lists equal)
_PRESET_WORDS = ("auto", "h200", "h100", "a100-80gb", "a100-40gb", "l40s", "rtx-5090", "rtx-4090", "a10g", "l4",
                 "gpu-100gb", "gpu-60gb", "gpu-36gb", "gpu-20gb", "gpu-small", "cpu")


def fraction() -> Kind:
    return Kind(float, "a number", lambda value: None if 0 <= value <= 1 else f"{value} is outside 0..1")


def choice(*allowed: str, case: Callable[[str], str] = str.lower) -> Kind:
    """One word of `allowed`, read in any letter case."""
    def check(value) -> str | None:
        return None if value in allowed else f"{value!r} is not one of {', '.join(allowed)}"

    return Kind(case, " | ".join(allowed), check)


PREFILL_GROUPS = (8, 16, 32, 64)  # TTS_PREFILL_GROUP's values: prompts per prefill call (engine/device/runner.py)
SWITCH_WORDS = {"auto": "auto", "on": "on", "off": "off", "1": "on", "true": "on", "yes": "on", "0": "off",
                "false": "off", "no": "off"}


def _switch_word(text: str) -> str:
    try:
        return SWITCH_WORDS[text.lower()]
    except KeyError:
        raise ValueError(text) from None


def toggle(auto: bool) -> Kind:
    """auto | on | off for a plain yes/no setting: the value is a bool, `auto` its default."""
    def parse(text: str) -> bool:
        return {"auto": auto, "on": True, "off": False}[_switch_word(text)]

    return Kind(parse, "auto, on or off", lambda value: None if isinstance(value, bool) else f"{value!r} is not a bool")


def three_way() -> Kind:
    """auto | on | off where auto is decided later (at start, from what the machine has): the word is the value."""
    return Kind(_switch_word, "auto, on or off",
                lambda value: None if value in ("auto", "on", "off") else f"{value!r} is not auto, on or off")


def _device(value) -> str | None:
    ok = value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())
    return None if ok else f"{value!r} is not one of auto, cpu, cuda, cuda:N"


def _devices(value) -> str | None:
    if value == "auto":
        return None
    bad = [d for d in value.split(",") if d == "auto" or _device(d)]
    return f"{', '.join(map(repr, bad))} not one of cpu, cuda, cuda:N" if bad else None


def _fault(value) -> str | None:
    if not value:
        return None
    index, _, steps = value.partition("@")
    return None if index.isdigit() and steps.isdigit() and int(steps) > 0 else f"{value!r} is not INDEX@STEPS"


TEXT = Kind(str, "text")
PATH = Kind(Path, "a path")
PRESENT = Kind(lambda text: True, "any text")  # a variable whose presence is the signal
DEVICE = Kind(str.lower, "auto | cpu | cuda | cuda:N", _device)
DTYPE = choice("auto", "bfloat16", "float16", "float32")
DEVICES = Kind(lambda text: ",".join(d.strip() for d in text.lower().split(",")),
               "auto or a comma-separated list of cpu, cuda, cuda:N", _devices)
# TTS_FEATURES: a list of +NAME / -NAME over the speed features' defaults (engine/features.py, their registry)
FEATURE_LIST = Kind(features.normalise, "a comma-separated list of auto, none, all, +NAME, -NAME", features.check)


@dataclass(frozen=True)
class Var:
    name: str  # the environment variable
    field: str  # the dataclass field it sets
    kind: Kind
    meaning: str
    dev: bool = False  # an experiment knob: docs/configuration.md's "Developer settings" table
    secret: bool = False  # a credential: set but blank is an error, not "unset" (a blank key must not mean auth off)


def read(cls: type[C], table: tuple[Var, ...], env: Mapping[str, str] | None = None,
         defaults: Mapping[str, object] | None = None, overrides: Mapping[str, object] | None = None) -> C:
    """The one parser: cls's own defaults, then the adapter's platform `defaults`, then the environment, then
    `overrides` (command-line flags; None means not given). Every value that comes out is checked, whichever
    layer it came from; an error names the variable and says what is wrong in one line."""
    env = os.environ if env is None else env
    values: dict[str, object] = dict(defaults or {})
    for var in table:
        raw = env.get(var.name, "")
        text = raw.strip()
        if var.secret and raw and not text:  # TTS_API_KEY=" " would silently mean "not set": auth off
            raise ConfigError(f"environment variable {var.name} is blank (whitespace only): unset it or give a value")
        if text:
            try:
                values[var.field] = var.kind.parse(text)
            except ValueError:
                raise ConfigError(f"environment variable {var.name}={text!r}: expected {var.kind.expected}") from None
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = set(values) - {f.name for f in fields(cls)}
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} setting(s): {', '.join(sorted(unknown))}")
    cfg = replace(cls(), **values)
    for var in table:
        value = getattr(cfg, var.field)
        why = None if value is None else var.kind.check(value)
        if why:
            raise ConfigError(f"{var.name}: {why}")
    return cfg


# ---- the engine ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path = Path(DEFAULT_MODEL_DIR)
    device: str = "auto"  # auto | cpu | cuda | cuda:N: one engine's device (TTS_DEVICES makes the engines)
    devices: str = "auto"  # auto | "cuda:0,cuda:1,...": one engine per entry (engine/placement.py)
    topology: str = "replicas"  # replicas: whole engine per device | split: DualAR and codec on a pair of devices
    process: str = "auto"  # auto (own process on CUDA) | on | off: the engines in a process of their own (serving)
    codec_device: str = ""  # where this engine's codec runs ("": with the DualAR); set by the placement
    kv_share: int = 1  # engines on this device still to size their KV cache, this one included (placement)
    fail_engine: str = ""  # test hook "INDEX@STEPS": that engine fails as with a CUDA error at that decode step
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32
    codec_dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32
    chunk_length: int = 200  # characters per text chunk of a long text
    max_text_length: int = 20_000  # characters per request
    max_reference_seconds: float = 60.0
    max_references: int = 8  # reference voices (audio or codes) per request
    reference_cache_size: int = 64  # encoded references kept in memory (LRU, by content hash)
    allow_special_tokens: bool = False  # honour <|...|> control tokens inside request text
    log_level: str = "INFO"
    # batching engine
    memory_preset: str = "auto"  # engine/presets.py: auto (from the GPU's name and memory) | a preset's name
    max_batch: int = 0  # concurrent streams on the device; 0 = the preset's
    max_queue: int = 0  # requests waiting for a slot before new ones get "busy"; 0 = auto (2 x max_batch)
    admit_rtf: float | None = None  # goodput admission (control/goodput.py): None = auto (1.2 on a GPU, off on CPU)
    admit_wait: float = 1.0  # with goodput admission on: the longest expected wait for a slot a stream is queued for
    kv_cache_tokens: int = 0  # KV positions in the paged cache; 0 = the preset's, within the memory share
    gpu_memory_utilization: float = 0.0  # the engine's share of the GPU's memory (vLLM's meaning); 0 = the preset's
    prefill_tokens: int = 4096  # prompt tokens prefilled per engine step at most (keeps running streams moving)
    prefill_group: int = 8  # prompts per prefill call with prefill graphs: 8, 16, 32 or 64
    prefix_cache: bool = True  # share the KV pages of prompt prefixes (a voice's references) between requests
    first_chunk_frames: int = 4  # frames before a stream's first audio chunk (21.5 frames = 1 s)
    stream_chunk_frames: int = 8  # the largest later audio chunk (they grow from the first: 4, 4, 8, 8, ...)
    features: str = "auto"  # the speed features over their defaults: +NAME / -NAME (engine/features.py)
    layer_gemv_rows: int = 0  # steps of up to this many rows run layer_gemv's kernels (1-64; 0 = auto), larger cuBLAS
    cache_dir: Path | None = None  # torch.compile kernel cache (Inductor + Triton); None = torch's default
    quant: str = "bf16"  # weight-only quantization of linear layers: bf16 (none) | int8 | int4
    int8_kernel: str = "auto"  # int8 implementation: auto | fused | tile | dequant | off (model/quant.py)
    default_max_new_tokens: int = 0  # frames per chunk when a request does not say; 0 = the family's (1024)

    def __post_init__(self):
        # Python callers may pass strings for the paths (from_env gives Paths): the engine calls Path methods on them
        for name in ("model_dir", "cache_dir"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)) and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)


PLACEMENT_FIELDS = {"codec_device", "kv_share"}  # EngineConfig fields engine/placement.py sets, never the environment
ENGINE_VARS = (
    Var("TTS_MODEL_DIR", "model_dir", PATH, "model directory (config.json, model.pth, tokenizer files, codec.pth)"),
    Var("TTS_DEVICE", "device", DEVICE, "auto | cpu | cuda | cuda:N: the device of a single engine (see TTS_DEVICES)"),
    Var("TTS_DEVICES", "devices", DEVICES,
        "auto (every visible GPU, else one CPU engine; TTS_DEVICE if set) | a list such as cuda:0,cuda:1: one engine "
        "per entry behind one front (repeats allowed: cpu,cpu)"),
    Var("TTS_TOPOLOGY", "topology", choice("replicas", "split"),
        "replicas (default): a whole engine per device | split: the DualAR on one device of each pair, its codec on "
        "the other (an even number of devices)"),
    Var("TTS_ENGINE_PROCESS", "process", three_way(),
        "auto (default: on when a GPU serves) | on | off: the engines run in a process of their own, apart from the "
        "HTTP server and the encoders, so per-stream work there never slows the decode loop; off: one process"),
    Var("TTS_DTYPE", "dtype", DTYPE, "DualAR weights: auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32"),
    Var("TTS_CODEC_DTYPE", "codec_dtype", DTYPE,
        "codec weights: auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32"),
    Var("TTS_CHUNK_LENGTH", "chunk_length", integer(50, 1000),
        "characters per chunk when a long text is split at sentences (50-1000)"),
    Var("TTS_MAX_TEXT_LENGTH", "max_text_length", integer(1), "longest accepted request text, in characters"),
    Var("TTS_MAX_REFERENCE_SECONDS", "max_reference_seconds", positive_number(),
        "longest accepted reference audio, in seconds"),
    Var("TTS_MAX_REFERENCES", "max_references", integer(1, 1000),
        "most reference voices (audio or codes) one request may give (default 8); more is a 400 before any is read"),
    Var("TTS_REFERENCE_CACHE_SIZE", "reference_cache_size", integer(0), "encoded reference voices kept in memory"),
    Var("TTS_ALLOW_SPECIAL_TOKENS", "allow_special_tokens", toggle(auto=False),
        "on = honour <|...|> control tokens in request text (auto = off)"),
    Var("TTS_LOG_LEVEL", "log_level", choice("DEBUG", "INFO", "WARNING", "ERROR", case=str.upper),
        "DEBUG | INFO | WARNING | ERROR"),
    Var("TTS_MEMORY_PRESET", "memory_preset", choice(*_PRESET_WORDS),
        "auto (from the GPU's name and memory) | a preset's name (docs/configuration.md, 'Memory presets')"),
    # upper bounds: far above any GPU's preset, low enough that a typo (an extra zero or three) fails at start
    # with its name instead of as an allocation that takes the host or GPU down
    Var("TTS_MAX_BATCH", "max_batch", integer(0, 4096, note=" (0 = auto)"),
        "concurrent streams per GPU; 0 = the memory preset's (docs/configuration.md, 'Memory presets')"),
    Var("TTS_MAX_QUEUE", "max_queue", integer(0, 100_000, note=" (0 = auto)"),
        "requests allowed to wait for a slot before new ones get 'busy'; 0 = 2 x max batch"),
    Var("TTS_ADMIT_RTF", "admit_rtf", rtf_or_auto(),
        "goodput admission: a new stream is refused (503, Retry-After) while the engine's measured step and codec "
        "times say the streams together would fall below this x real time; auto = 1.2 on a GPU, off on a CPU "
        "(never real time there); 0 = off (the slots and TTS_MAX_QUEUE alone decide)"),
    Var("TTS_ADMIT_WAIT", "admit_wait", seconds_up_to(3600),
        "with goodput admission on (TTS_ADMIT_RTF): every slot taken, a new stream waits for one only while the "
        "streams ahead of it, at the rate streams have been ending, would free it within this many seconds; "
        "otherwise a 503 with Retry-After at once; 0 = no waiting"),
    Var("TTS_KV_CACHE_TOKENS", "kv_cache_tokens", integer(0, 1 << 24, note=" (0 = auto)"),
        "KV-cache positions shared by all streams; 0 = the preset's positions per stream x max batch, within the "
        "GPU memory share"),
    Var("TTS_GPU_MEMORY_UTILIZATION", "gpu_memory_utilization", fraction(),
        "fraction of the GPU's memory the engine may use, weights included (vLLM's meaning); 0 = the preset's "
        "(0.85)"),
    Var("TTS_PREFILL_TOKENS", "prefill_tokens", integer(1),
        "prompt tokens prefilled per engine step at most (longer prompts go in chunks)", dev=True),
    Var("TTS_PREFILL_GROUP", "prefill_group",
        integer_of(*PREFILL_GROUPS),
        "prompts prefilled per call with prefill graphs (each call's shape a graph; a call costs about the same "
        "whatever its size, so a burst goes in faster in larger groups, at more graphs to capture); default 8",
        dev=True),
    Var("TTS_PREFIX_CACHE", "prefix_cache", toggle(auto=True),
        "on (default) | off: a voice's prompt prefix (its references) is prefilled once and its KV pages shared"),
    Var("TTS_FIRST_CHUNK_FRAMES", "first_chunk_frames", integer(1),
        "frames (1/21.5 s each) before a stream's first audio chunk", dev=True),
    Var("TTS_STREAM_CHUNK_FRAMES", "stream_chunk_frames", integer(1),
        "frames of the largest later audio chunk: later chunks grow from the first, each at most the audio already "
        "made (with 32: 4, 4, 8, 16, 32, 32, ...)",
        dev=True),
    Var("TTS_FEATURES", "features", FEATURE_LIST,
        "auto (default: every speed feature that is on by default where it runs) | a comma-separated list over "
        "that: -NAME turns a feature off, +NAME (or NAME) on where it can run (a warning where it cannot), none / all "
        "every feature off / on, kernels the decode step's fused kernels as a group, later items win (e.g. "
        "-cuda_graphs,-kernels,+merged_ffn); the features: docs/configuration.md, 'Speed features'", dev=True),
    Var("TTS_LAYER_GEMV_ROWS", "layer_gemv_rows", integer(0, 64, note=" (0 = auto)"),
        "0 = auto (default: 64 where kernels launch with PDL and weights are 16-bit; else 16) | 1-64: decode steps "
        "whose bucket holds up to this many rows (buckets 1, 2, 4, ...) run layer_gemv's fused kernels; larger "
        "buckets run the step's other ops (compiled units over cuBLAS, or eager)",
        dev=True),
    Var("TTS_CACHE_DIR", "cache_dir", PATH, "directory of the torch.compile kernel cache (keep it on a volume)"),
    Var("TTS_QUANT", "quant", choice("bf16", "none", "int8", "int4"),
        "bf16 (no quantization) | int8 | int4: weight-only quantization of linear layers"),
    Var("TTS_INT8_KERNEL", "int8_kernel", choice("auto", "fused", "tile", "dequant", "off"),
        "auto | fused | tile | dequant | off: the int8 linear (tile = fused without its 1-2 row GEMV kernel; "
        "off = torchao's or the legacy form, which torch.compile turns into a slow kernel)", dev=True),
    Var("TTS_TEST_FAIL_ENGINE", "fail_engine", Kind(str, "INDEX@STEPS", _fault),
        "test hook: engine INDEX (0-based, TTS_DEVICES order) fails as with a CUDA error at its STEPS-th decode step "
        "and is taken out of service", dev=True),
    Var("TTS_DEFAULT_MAX_NEW_TOKENS", "default_max_new_tokens", integer(0, note=" (0 = auto)"),
        "frames per chunk if a request gives none (0: 1024)"),
)


def from_env(env: Mapping[str, str] | None = None, defaults: Mapping[str, object] | None = None,
             **overrides) -> EngineConfig:
    """Builds the engine config from TTS_* variables; `defaults` (a platform's) yield to them, keyword
    overrides (e.g. from CLI flags) win."""
    env = os.environ if env is None else env
    cfg = read(EngineConfig, ENGINE_VARS, env, defaults, overrides)
    old = _retired(env)
    if not old:
        return cfg
    return replace(cfg, features=features.normalise(",".join(old + ([] if cfg.features == "auto" else [cfg.features]))))


def read_ahead_paths(env: Mapping[str, str] | None = None) -> tuple[Path, Path | None] | None:
    """(model directory, cache directory) whose weight files an entry point may start reading before its imports
    (feature early_readahead; serving/prefetch.py); None when that is switched off or the environment does not read
    (the start itself reports that, in its words)."""
    try:
        cfg = from_env(env)
    except ConfigError:
        return None
    if features.switched_off(cfg.features, features.EARLY_READAHEAD):
        return None
    return cfg.model_dir, cfg.cache_dir


def kernels_ahead(env: Mapping[str, str] | None = None) -> tuple[Path, str] | None:
    """(the kernel-cache directory, the quantization) of a start that may compile our Triton kernels into that cache
    ahead, in background processes (feature early_kernels; engine/device/compile/early_kernels.py); None when that is
    switched off, the engine runs on the CPU, there is no cache directory, or the environment does not read (the
    start itself reports that)."""
    try:
        cfg = from_env(env)
    except ConfigError:
        return None
    if features.switched_off(cfg.features, features.EARLY_KERNELS) or cfg.device == "cpu" or cfg.cache_dir is None:
        return None
    return cfg.cache_dir, cfg.quant


def environment() -> dict[str, str]:
    """This process's environment, for a child process that should see what it sees."""
    return dict(os.environ)


def with_dirs(model_dir: str | None, cache_dir: str | None) -> dict[str, str]:
    """This process's environment with TTS_MODEL_DIR and TTS_CACHE_DIR set to the directories given on a command line
    (None: as they are), for what a start begins before it parses its arguments (serving/prefetch.py): `warm
    --model DIR --cache-dir DIR` reads ahead and builds kernels ahead as the variables would have it."""
    env = dict(os.environ)
    for name, value in (("TTS_MODEL_DIR", model_dir), ("TTS_CACHE_DIR", cache_dir)):
        if value:
            env[name] = value
    return env


def with_visible_gpus(gpus: str) -> dict[str, str]:
    """This process's environment with CUDA_VISIBLE_DEVICES=`gpus`: what an engine process is started with (feature
    own_gpu_view; serving/engine_process/remote_fleet.py)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}


def visible_gpus() -> str | None:
    """CUDA_VISIBLE_DEVICES as this process has it (None: unset, every GPU in physical order): the list whose
    entries a cuda:N counts."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


# the on/off variables TTS_FEATURES replaced, still read for one release (a warning names the replacement):
# variable -> the feature (or group) it switched
RETIRED = {"TTS_CUDA_GRAPHS": features.CUDA_GRAPHS, "TTS_COMPILE": features.COMPILE,
           "TTS_PRECOMPILE": features.PRECOMPILE, "TTS_ONE_ROW_BUCKET": features.ONE_ROW_BUCKET,
           "TTS_LAZY_GRAPHS": features.LAZY_GRAPHS, "TTS_PREFILL_GRAPHS": features.PREFILL_GRAPHS,
           "TTS_OVERLAP_STEP": features.OVERLAP_STEP, "TTS_STEP_PRIORITY": features.STEP_PRIORITY,
           "TTS_FUSED_KERNELS": "kernels", "TTS_CODEC_COMPILE": features.CODEC_COMPILE,
           "TTS_SNAKE_KERNEL": features.SNAKE_KERNEL, "TTS_CUDNN_BENCHMARK": features.CUDNN_BENCHMARK,
           "TTS_CODEC_CHANNELS_LAST": features.CODEC_CHANNELS_LAST, "TTS_CODEC_MERGE": features.CODEC_MERGE,
           "TTS_CODEC_ROUNDS": features.CODEC_ROUNDS, "TTS_CODEC_PINNED_COPY": features.CODEC_PINNED_COPY,
           "TTS_CODEC_CACHE": features.CODEC_CACHE}


_WARNED: set[tuple[str, str]] = set()


def _retired(env: Mapping[str, str]) -> list[str]:
    """TTS_FEATURES items that say what the replaced variables set in `env` said, with one warning each."""
    items: list[str] = []
    for var, name in RETIRED.items():
        text = env.get(var, "").strip().lower()
        if not text:
            continue
        word = SWITCH_WORDS.get(text)
        if word is None and name == "kernels":  # a list of kernels: those on, the others off
            bad = [k for k in _names(text) if k not in features.KERNELS]
            if bad:
                raise ConfigError(f"{var}: {', '.join(map(repr, bad))} not one of {', '.join(features.KERNELS)}")
            new = ["-kernels"] + ["+" + k for k in _names(text)]
        elif word is None:
            raise ConfigError(f"environment variable {var}={text!r}: expected auto, on or off")
        elif word == "auto":
            new = []
        elif name == features.CUDNN_BENCHMARK and word == "off":  # it was both: in graph captures and everywhere
            new = ["-" + features.CUDNN_TUNING, "-" + name]
        else:
            new = [("+" if word == "on" else "-") + name]
        if (var, text) not in _WARNED:  # once a process: the CLI and the adapters read the config more than once
            _WARNED.add((var, text))
            log.warning("%s is replaced by TTS_FEATURES and goes in the next release: read as TTS_FEATURES=%s", var,
                        ",".join(new) or "auto")
        items += new
    return items


def _names(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


# ---- the network adapters (HTTP, SageMaker serve) ----------------------------------------------------------
@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # this machine only; the image sets TTS_HOST=0.0.0.0 (Dockerfile)
    port: int = 8080
    api_key: str | None = None
    data_dir: Path = Path("data")
    max_body_bytes: int = 25 << 20
    max_upload_bytes: int = 20 << 20
    voice_aliases: tuple[tuple[str, str], ...] = ()  # (name, voice id or "default"); OpenAI's names fall back too
    strict_fields: bool = False  # unknown request fields: False ignores them (named in a header), True is a 400
    cors_origins: tuple[str, ...] = ()  # () = no CORS headers: browsers keep other origins out
    download_ttl: int = 3600  # seconds a finished file behind a download link is kept
    download_max_bytes: int = 512 << 20  # all kept download files together; the oldest go first
    download_max_files: int = 10_000  # kept download files (and those being written) at most; the oldest go first
    drain_seconds: int = 30
    read_timeout: float = 30.0
    # slow clients that keep sending, too slowly for read_timeout to see (serving/network/connection_guard.py,
    # serving/network/body_limit.py); 0 switches each off
    idle_timeout: float = 5.0  # a connection with no request under way: a new one, or one between requests
    header_timeout: float = 10.0  # from a request's first byte to the end of its headers
    max_connections: int = 0  # open at once (WebSockets too); past it a new one gets a 503; 0 = the fd limit - 256
    body_min_rate: float = 1024.0  # bytes/s a request body must average once body_rate_grace has passed
    body_rate_grace: float = 10.0
    body_timeout: float = 600.0  # a whole request body, however fast it arrives
    trace_chunks: bool = False  # per-chunk stage timings and per-thread CPU in /metrics (serving/chunk_trace.py)
    live_idle_timeout: float = 60.0  # seconds a live WebSocket may stay silent (no message, no audio) before it closes
    live_max_chars: int = 100_000  # text one live session may send
    encoder_processes: int | None = None  # audio encoder worker processes; None: min(8, CPUs // 2); 0: threads
    live_send_buffer: int = 8 << 20  # bytes a live socket may have waiting for a client that does not read
    ready_when: str = "settled"  # /ready and /ping: settled (every lazy graph captured) | serving (an engine serves)
    ready_max_wait: float = 120.0  # seconds settled may hold /ready back after the first engine serves

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, defaults: Mapping[str, object] | None = None,
                 **overrides) -> ServerConfig:
        return read(ServerConfig, SERVER_VARS, env, defaults, overrides)


# voices.ID_PATTERN (config imports nothing of the serving layer; a test keeps the two equal)
VOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,63}$")


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    """"alloy=alice, nova=default" -> (("alloy", "alice"), ("nova", "default")); an item without "=" keeps an
    empty target for `_aliases` to name. Names are matched in any letter case, so they are kept lower case."""
    items = [item.partition("=") for item in text.split(",") if item.strip()]
    return tuple((name.strip().lower(), target.strip() if eq else "") for name, eq, target in items)


def _aliases(value) -> str | None:
    names = [name for name, _ in value]
    for name, target in value:
        if not target:
            return f"{name!r} names no voice (write NAME=VOICE, e.g. alloy=alice)"
        for word in (name, target):
            if not VOICE_ID.fullmatch(word):
                return f"{word!r} is not a voice name (1-64 letters, digits, spaces, _ or -)"
        if names.count(name) > 1:
            return f"{name!r} is given twice"
        if name == "default":
            return "'default' is the model's own voice: it cannot stand for another"
    return None


def _origins(text: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in text.split(",") if o.strip())


ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]+$", re.I)


def _origins_check(value) -> str | None:
    if "*" in value:
        return None if value == ("*",) else "'*' allows every origin: give it alone"
    for origin in value:
        if not ORIGIN.fullmatch(origin):
            why = "a browser's Origin has no path (drop the trailing /)" if origin.endswith("/") else \
                "expected scheme://host[:port]"
            return f"{origin!r}: {why}"
    return None


PORT = integer(1, 65535)
DATA_DIR = Var("TTS_DATA_DIR", "data_dir", PATH, "stored voices (default ./data; /data in the image)")
VOICE_ALIASES = Var("TTS_VOICE_ALIASES", "voice_aliases", Kind(_pairs, "NAME=VOICE,...", _aliases),
                    "voice names that stand for a stored voice or `default`, e.g. alloy=alice,nova=bob; OpenAI's "
                    "voice names not listed (and not stored voices themselves) mean `default`")
STRICT_FIELDS = Var("TTS_STRICT_FIELDS", "strict_fields", toggle(auto=False),
                    "on: an unknown request field is a 400 | auto (= off): it is ignored and named (HTTP and serve: "
                    "X-Ignored-Fields; RunPod: ignored_fields in the output)")
TRACE_CHUNKS = Var("TTS_TRACE_CHUNKS", "trace_chunks", toggle(auto=False),
                   "on: each audio piece's time from the engine to the client, per stage: the HTTP adapters in "
                   "/metrics (and the CPU per thread), the RunPod worker one log line per streamed job (default off)",
                   dev=True)
READY_WHEN = Var("TTS_READY_WHEN", "ready_when", choice("settled", "serving"),
                 "when /ready (and SageMaker's /ping) says 200, and a RunPod worker or SageMaker's model_fn starts "
                 "taking work: settled (default) once the engines have captured every CUDA graph left for later and "
                 "frozen their start-up heap (gc_freeze), so a burst sent then is served at full speed | serving: as "
                 "soon as an engine serves (sooner, but the first burst pays the captures)")
READY_MAX_WAIT = Var("TTS_READY_MAX_WAIT", "ready_max_wait", positive_number(),
                     "seconds settled may hold /ready (RunPod: the first job) back after the first engine serves; then "
                     "200 with graphs_pending > 0, the rest captured at first use (default 120)")
DRAIN_SECONDS = Var("TTS_DRAIN_SECONDS", "drain_seconds", integer(0, 3600),
                    "on SIGTERM: seconds the requests (RunPod: jobs) in flight may take to finish while new ones "
                    "get 503 (default 30; 0 cuts them at once); a second signal cuts them too")
ENCODER_PROCESSES = Var(
    "TTS_ENCODER_PROCESSES", "encoder_processes", integer(0, 64),
    "worker processes that encode mp3, opus, aac, flac (and wav/pcm with a speed change) outside the server "
    "process (default min(8, CPUs / 2); 0: threads of the server process); RunPod reads it too")
SERVER_VARS = (
    Var("TTS_HOST", "host", TEXT,
        "address the HTTP server binds (default 127.0.0.1: this machine only; 0.0.0.0 in the image)"),
    Var("TTS_PORT", "port", PORT, "port of the HTTP server (default 8080)"),
    Var("TTS_API_KEY", "api_key", Kind(str, "printable ASCII text", _api_key),
        "if set, every API route needs `Authorization: Bearer <key>` (health, ready, metrics and / do not); "
        "whitespace only is a start-up error", secret=True),
    DATA_DIR,
    Var("TTS_MAX_BODY_BYTES", "max_body_bytes", integer(1024), "largest request body (default 25 MB)"),
    Var("TTS_MAX_UPLOAD_BYTES", "max_upload_bytes", integer(1024), "largest uploaded reference audio (default 20 MB)"),
    VOICE_ALIASES,
    STRICT_FIELDS,
    Var("TTS_CORS_ORIGINS", "cors_origins", Kind(_origins, "* or a list of scheme://host[:port]", _origins_check),
        "origins a browser app may call the API from: * or a comma-separated list (default: none)"),
    Var("TTS_DOWNLOAD_TTL", "download_ttl", integer(1), "seconds a file behind a download link is kept (default 3600)"),
    Var("TTS_DOWNLOAD_MAX_BYTES", "download_max_bytes", integer(0),
        "total size of the files kept for download links, those being written included; the oldest go first "
        "(default 512 MB; 0: no links)"),
    Var("TTS_DOWNLOAD_MAX_FILES", "download_max_files", integer(1),
        "number of files kept for download links, those being written included; the oldest go first "
        "(default 10000)"),
    DRAIN_SECONDS,
    Var("TTS_READ_TIMEOUT", "read_timeout", positive_number(),
        "seconds a client may pause while sending its request body before it gets 408 (default 30)"),
    Var("TTS_IDLE_TIMEOUT", "idle_timeout", number_or_off(),
        "seconds a connection may stay open without a request under way, a new one before its first byte or a "
        "kept-alive one between requests; then it is closed (default 5; 0: never)"),
    Var("TTS_HEADER_TIMEOUT", "header_timeout", number_or_off(),
        "seconds from a request's first byte to the end of its headers; then 408 and the connection is closed "
        "(default 10; 0: no limit)"),
    Var("TTS_MAX_CONNECTIONS", "max_connections", integer(0, 1 << 24, note=" (0 = auto)"),
        "connections open at once, WebSockets included; a new one past it is answered 503 (JSON, Retry-After) and "
        "closed before its request is read, so a flood cannot take the descriptors the server needs for its own "
        "files; 0 (default) = the process's file-descriptor limit less 256"),
    Var("TTS_BODY_MIN_RATE", "body_min_rate", number_or_off("bytes per second"),
        "bytes per second a request body must average from when the server starts reading it, once "
        "TTS_BODY_RATE_GRACE has passed; slower is a 408 (default 1024; 0: no minimum)"),
    Var("TTS_BODY_RATE_GRACE", "body_rate_grace", number_or_off(),
        "seconds a request body may arrive at any rate before TTS_BODY_MIN_RATE applies (default 10)"),
    Var("TTS_BODY_TIMEOUT", "body_timeout", number_or_off(),
        "seconds a whole request body may take to arrive, however steadily; then 408 (default 600; 0: no limit)"),
    Var("TTS_LIVE_IDLE_TIMEOUT", "live_idle_timeout", positive_number(),
        "seconds a live WebSocket (/v1/tts/live) may go without a message from the client or audio to it before "
        "it is closed (default 60)"),
    Var("TTS_LIVE_MAX_CHARS", "live_max_chars", integer(1),
        "characters of text one live session may send (default 100000)"),
    ENCODER_PROCESSES,
    Var("TTS_LIVE_SEND_BUFFER", "live_send_buffer", integer(1024),
        "bytes of audio a live WebSocket may hold for a client that does not read it; past them the session is "
        "cancelled and the socket closed (1008; default 8388608)"),
    READY_WHEN,
    READY_MAX_WAIT,
    TRACE_CHUNKS,
)


def encoder_processes(env: Mapping[str, str] | None = None) -> int:
    """TTS_ENCODER_PROCESSES alone (the encoder pool starts lazily under every adapter, RunPod's too, which has no
    ServerConfig); unset: min(8, usable CPUs // 2), so that encoding leaves cores to the engine and event loop."""
    n = read(ServerConfig, (ENCODER_PROCESSES,), env).encoder_processes
    if n is not None:
        return n
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cpus // 2)


@dataclass(frozen=True)
class SageMakerConfig:
    port: int | None = None  # None: SageMaker did not say; serve falls back to TTS_PORT, then 8080

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> SageMakerConfig:
        return read(SageMakerConfig, SAGEMAKER_VARS, env)


SAGEMAKER_VARS = (
    Var("SAGEMAKER_BIND_TO_PORT", "port", PORT, "port of `serve` (SageMaker sets it; default 8080)"),
)


# ---- the RunPod worker ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunPodConfig:
    concurrency: int = 0  # 0 = follow the engine's stream slots
    s3_bucket: str | None = None
    max_inline_bytes: int = 10_000_000  # RunPod's /run result limit is about 10 MB
    url_expires: int = 86400
    data_dir: Path = Path("data")  # stored voices (reference_id)
    progress_updates: bool = False  # RunPod's queue is there to take them (not its local test API)
    drain_seconds: int = 30  # on SIGTERM: the jobs in flight get this long, then end with an error item
    voice_aliases: tuple[tuple[str, str], ...] = ()  # as ServerConfig's: the same bodies work on every adapter
    strict_fields: bool = False
    ready_when: str = "settled"  # as ServerConfig's: the worker takes jobs once the lazy graphs are captured
    ready_max_wait: float = 120.0
    aggregate_stream: bool = True  # a job's items also go back as one list at its end (/runsync, /status)
    trace_chunks: bool = False  # TTS_TRACE_CHUNKS: one log line per streamed job, where its chunks' time went
    # RunPod's SDK logs three DEBUG lines per streamed item by default: the worker sets INFO unless one of these is set
    sdk_log_level: str | None = None  # RUNPOD_LOG_LEVEL
    sdk_debug_level: str | None = None  # RUNPOD_DEBUG_LEVEL, the SDK's older name (RUNPOD_LOG_LEVEL wins)

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, defaults: Mapping[str, object] | None = None) -> RunPodConfig:
        return read(RunPodConfig, RUNPOD_VARS, env, defaults)


SDK_LOG_LEVEL = choice("NOTSET", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", case=str.upper)  # runpod's rp_logger


RUNPOD_VARS = (
    Var("RUNPOD_CONCURRENCY", "concurrency", integer(0, note=" (0 = the engine's stream slots)"),
        "jobs one RunPod worker takes at once (default: the engine's free stream slots)"),
    Var("RUNPOD_S3_BUCKET", "s3_bucket", TEXT,
        "bucket for RunPod outputs: jobs with \"upload\": true, and any output over the inline limit"),
    Var("RUNPOD_MAX_INLINE_BYTES", "max_inline_bytes", integer(1024),
        "largest audio a RunPod job returns inline, base64 included (default 10 MB)"),
    Var("RUNPOD_S3_URL_EXPIRES", "url_expires", integer(1),
        "lifetime of the presigned URL of an uploaded output, in seconds (default 86400)"),
    Var("RUNPOD_AGGREGATE_STREAM", "aggregate_stream", toggle(auto=True),
        "auto (= on): a job's items also come back as one list when it ends (/runsync, /status) | off: only on "
        "/stream, for every job, whole-file ones too; halves what the worker serialises (docs/deploy-runpod.md)"),
    DATA_DIR,
    DRAIN_SECONDS,
    VOICE_ALIASES,
    STRICT_FIELDS,
    READY_WHEN,
    READY_MAX_WAIT,
    TRACE_CHUNKS,
    Var("RUNPOD_LOG_LEVEL", "sdk_log_level", SDK_LOG_LEVEL,
        "the RunPod SDK's log level (default here INFO; the SDK's own default, DEBUG, logs three lines per streamed "
        "item)"),
    Var("RUNPOD_DEBUG_LEVEL", "sdk_debug_level", SDK_LOG_LEVEL,
        "the SDK's older name for RUNPOD_LOG_LEVEL, read when that is unset"),
    Var("RUNPOD_WEBHOOK_POST_OUTPUT", "progress_updates", PRESENT,
        "set by RunPod's job queue (not its local test API): progress updates have somewhere to go"),
)


# ---- model download ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadConfig:
    hf_token: str | None = None
    model_source: str | None = None  # fetched into TTS_MODEL_DIR at start when that is empty

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> DownloadConfig:
        return read(DownloadConfig, DOWNLOAD_VARS, env)


DOWNLOAD_VARS = (
    Var("HF_TOKEN", "hf_token", TEXT, "Hugging Face token for `ttsengine download --hf` (the S1-mini repo is gated)"),
    Var("TTS_MODEL_SOURCE", "model_source", TEXT,
        "where `runpod` (and the compose model service) fetch the model when TTS_MODEL_DIR is empty or holds "
        "another source's: hf://fishaudio/openaudio-s1-mini, s3://bucket/prefix, a directory or `tiny`"),
)

TABLES = (ENGINE_VARS, SERVER_VARS, SAGEMAKER_VARS, RUNPOD_VARS, DOWNLOAD_VARS)
# every variable once (TTS_DATA_DIR sets a field of two dataclasses through one Var); docs/configuration.md too
ENV_VARS: dict[str, Var] = {var.name: var for table in TABLES for var in table}
