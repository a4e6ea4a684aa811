"""Engine configuration: one frozen dataclass, built once at the edge by `from_env()`.

This is the only module of the core that reads the environment. Every variable is listed in
ENV_VARS (and in the README's table, which a test keeps in sync).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .errors import ConfigError

DEFAULT_MODEL_DIR = "/opt/ml/model"  # SageMaker's path, used everywhere


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path = Path(DEFAULT_MODEL_DIR)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32
    codec_dtype: str = "auto"  # auto (fp32) | bfloat16 | float16 | float32
    chunk_length: int = 200  # characters per text chunk of a long text
    max_text_length: int = 20_000  # characters per request
    max_reference_seconds: float = 60.0
    reference_cache_size: int = 64  # encoded references kept in memory (LRU, by content hash)
    allow_special_tokens: bool = False  # honour <|...|> control tokens inside request text
    log_level: str = "INFO"
    # batching engine
    max_batch: int = 0  # concurrent streams on the device; 0 = auto (256 on CUDA, 8 on CPU)
    max_queue: int = 0  # requests waiting for a slot before new ones get "busy"; 0 = auto (2 x max_batch)
    kv_cache_tokens: int = 0  # KV positions in the paged cache; 0 = auto (from free GPU memory)
    prefill_tokens: int = 4096  # prompt tokens prefilled per engine step (keeps running streams moving)
    first_chunk_frames: int = 4  # frames before a stream's first audio chunk (21.5 frames = 1 s)
    stream_chunk_frames: int = 8  # frames per later audio chunk
    cuda_graphs: str = "auto"  # auto (on with CUDA) | on | off
    lazy_graphs: bool = True  # capture only the smallest bucket before ready, the others when idle or first used
    compile: str = "auto"  # torch.compile of the decode step: auto (on with CUDA, torch >= 2.6) | on | off
    codec_compile: str = "off"  # torch.compile the streaming codec too: on | off (its trace costs ~18 s per start)
    snake_kernel: str = "auto"  # Snake as one Triton kernel in the eager codec: auto (on CUDA with Triton) | off
    cache_dir: Path | None = None  # torch.compile kernel cache (Inductor + Triton); None = torch's default
    precompile: str = "auto"  # keep the step's traced units in cache_dir: auto (torch >= 2.10 with a cache dir) | off
    quant: str = "bf16"  # weight-only quantization of linear layers: bf16 (none) | int8 | int4
    int8_kernel: str = "auto"  # int8 implementation: auto | fused | tile | dequant | off (model/quant.py)
    default_max_new_tokens: int = 0  # frames per chunk when a request does not say; 0 = the family's (1024)

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)


# env var -> (field, parser, description); the README table lists the same names.
ENV_VARS: dict[str, tuple[str, str]] = {
    "TTS_MODEL_DIR": ("model_dir", "model directory (config.json, model.pth, tokenizer files, codec.pth)"),
    "TTS_DEVICE": ("device", "auto | cpu | cuda | cuda:N"),
    "TTS_DTYPE": ("dtype", "DualAR weights: auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32"),
    "TTS_CODEC_DTYPE": ("codec_dtype", "codec weights: auto (fp32) | bfloat16 | float16 | float32"),
    "TTS_CHUNK_LENGTH": ("chunk_length", "characters per chunk when a long text is split at sentences (50-1000)"),
    "TTS_MAX_TEXT_LENGTH": ("max_text_length", "longest accepted request text, in characters"),
    "TTS_MAX_REFERENCE_SECONDS": ("max_reference_seconds", "longest accepted reference audio, in seconds"),
    "TTS_REFERENCE_CACHE_SIZE": ("reference_cache_size", "encoded reference voices kept in memory"),
    "TTS_ALLOW_SPECIAL_TOKENS": ("allow_special_tokens", "1 = honour <|...|> control tokens in request text"),
    "TTS_LOG_LEVEL": ("log_level", "DEBUG | INFO | WARNING | ERROR"),
    "TTS_MAX_BATCH": ("max_batch", "concurrent streams per GPU; 0 = auto (256 on CUDA, 8 on CPU)"),
    "TTS_MAX_QUEUE": ("max_queue", "requests allowed to wait for a slot before new ones get 'busy'; 0 = 2 x max batch"),
    "TTS_KV_CACHE_TOKENS": ("kv_cache_tokens", "KV-cache positions shared by all streams; 0 = auto from free memory"),
    "TTS_PREFILL_TOKENS": ("prefill_tokens", "prompt tokens prefilled per engine step"),
    "TTS_FIRST_CHUNK_FRAMES": ("first_chunk_frames", "frames (1/21.5 s each) before a stream's first audio chunk"),
    "TTS_STREAM_CHUNK_FRAMES": ("stream_chunk_frames", "frames per later streamed audio chunk"),
    "TTS_CUDA_GRAPHS": ("cuda_graphs", "auto | on | off: replay the decode step as CUDA graphs"),
    "TTS_LAZY_GRAPHS": ("lazy_graphs", "1 = capture the smallest batch's graph before ready and the others while "
                                       "idle or at first use; 0 = all before ready"),
    "TTS_COMPILE": ("compile", "auto | on | off: torch.compile the decode step"),
    "TTS_CODEC_COMPILE": ("codec_compile", "on | off: torch.compile the streaming codec as well (~1 ms faster per "
                                           "small chunk on an H100; its trace adds ~18 s to every start)"),
    "TTS_SNAKE_KERNEL": ("snake_kernel", "auto | off: the codec's Snake activation as one Triton kernel (auto: on CUDA "
                                         "when the codec is not compiled)"),
    "TTS_CACHE_DIR": ("cache_dir", "directory of the torch.compile kernel cache (keep it on a volume)"),
    "TTS_PRECOMPILE": ("precompile", "auto | off: keep the decode step's traced units in TTS_CACHE_DIR (torch's AOT "
                                     "precompile, torch >= 2.10), so a warm start skips Dynamo's trace"),
    "TTS_QUANT": ("quant", "bf16 (no quantization) | int8 | int4: weight-only quantization of linear layers"),
    "TTS_INT8_KERNEL": ("int8_kernel", "auto | fused | tile | dequant | off: the int8 linear (tile = fused without "
                                       "its 1-2 row GEMV kernel; off = torchao's or the legacy form, which "
                                       "torch.compile turns into a slow kernel)"),
    "TTS_DEFAULT_MAX_NEW_TOKENS": ("default_max_new_tokens", "frames per chunk if a request gives none (0: 1024)"),
}
# Variables read outside EngineConfig (servers, download credentials), listed for the README table.
OTHER_ENV_VARS: dict[str, str] = {
    "HF_TOKEN": "Hugging Face token for `ttsengine download --hf` (the S1-mini repo is gated)",
    "TTS_HOST": "address the HTTP server binds (default 0.0.0.0)",
    "TTS_PORT": "port of the HTTP server (default 8080)",
    "TTS_API_KEY": "if set, every API route needs `Authorization: Bearer <key>` (health, ready, metrics and / do not)",
    "TTS_DATA_DIR": "stored voices (default ./data; /data in the image)",
    "TTS_MAX_BODY_BYTES": "largest request body (default 25 MB)",
    "TTS_MAX_UPLOAD_BYTES": "largest uploaded reference audio (default 20 MB)",
    "TTS_MODEL_SOURCE": "where `runpod` (and the compose model service) fetch the model when TTS_MODEL_DIR is "
                        "empty: hf://fishaudio/openaudio-s1-mini, s3://bucket/prefix or a directory",
    "SAGEMAKER_BIND_TO_PORT": "port of `serve` (SageMaker sets it; default 8080)",
    "RUNPOD_CONCURRENCY": "jobs one RunPod worker takes at once (default: the engine's free stream slots)",
    "RUNPOD_S3_BUCKET": "bucket for RunPod outputs: jobs with \"upload\": true, and any output over the inline limit",
    "RUNPOD_MAX_INLINE_BYTES": "largest audio a RunPod job returns inline, base64 included (default 10 MB)",
    "RUNPOD_S3_URL_EXPIRES": "lifetime of the presigned URL of an uploaded output, in seconds (default 86400)",
}
SAGEMAKER_BODY_LIMIT = 1 << 30  # async inference accepts payloads up to 1 GB
RUNPOD_VOLUME = Path("/runpod-volume")


@dataclass(frozen=True)
class ServerConfig:
    """Settings of the network adapters (HTTP, SageMaker serve)."""

    host: str = "0.0.0.0"
    port: int = 8080
    api_key: str | None = None
    data_dir: Path = Path("data")
    max_body_bytes: int = 25 << 20
    max_upload_bytes: int = 20 << 20

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, **overrides) -> ServerConfig:
        env = os.environ if env is None else env
        base = ServerConfig()
        values: dict[str, object] = {}
        for name, field in (("TTS_HOST", "host"), ("TTS_PORT", "port"), ("TTS_API_KEY", "api_key"),
                            ("TTS_DATA_DIR", "data_dir"), ("TTS_MAX_BODY_BYTES", "max_body_bytes"),
                            ("TTS_MAX_UPLOAD_BYTES", "max_upload_bytes")):
            text = env.get(name, "").strip()
            if text:
                current = getattr(base, field)
                values[field] = text if current is None else _parse(name, field, text, current)
        values.update({k: v for k, v in overrides.items() if v is not None})
        cfg = replace(base, **values)
        return cfg.validated()

    @staticmethod
    def for_sagemaker(env: Mapping[str, str] | None = None) -> ServerConfig:
        """`serve`: port SAGEMAKER_BIND_TO_PORT (8080), body limit 1 GB unless TTS_MAX_BODY_BYTES says
        otherwise (async inference payloads), voices stored beside the model (/opt/ml/model/voices)."""
        env = os.environ if env is None else env
        overrides: dict[str, object] = {}
        if env.get("SAGEMAKER_BIND_TO_PORT", "").strip():
            overrides["port"] = _parse("SAGEMAKER_BIND_TO_PORT", "port", env["SAGEMAKER_BIND_TO_PORT"], 0)
        if not env.get("TTS_MAX_BODY_BYTES", "").strip():
            overrides["max_body_bytes"] = SAGEMAKER_BODY_LIMIT
        if not env.get("TTS_DATA_DIR", "").strip():
            overrides["data_dir"] = Path(env.get("TTS_MODEL_DIR", "").strip() or DEFAULT_MODEL_DIR)
        return ServerConfig.from_env(env, **overrides)

    def validated(self) -> ServerConfig:
        cfg = self
        if not 0 < cfg.port < 65536:
            raise ConfigError(f"TTS_PORT: {cfg.port} is not a port number")
        if cfg.max_body_bytes < 1024 or cfg.max_upload_bytes < 1024:
            raise ConfigError("TTS_MAX_BODY_BYTES and TTS_MAX_UPLOAD_BYTES must be at least 1024")
        return cfg


@dataclass(frozen=True)
class RunPodConfig:
    concurrency: int = 0  # 0 = follow the engine's stream slots
    s3_bucket: str | None = None
    max_inline_bytes: int = 10_000_000  # RunPod's /run result limit is about 10 MB
    url_expires: int = 86400
    volume: Path | None = None  # /runpod-volume when mounted
    data_dir: Path = Path("data")  # stored voices (reference_id)
    progress_updates: bool = False  # RunPod's queue is there to take them (not its local test API)

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, volume: Path = RUNPOD_VOLUME) -> RunPodConfig:
        env = os.environ if env is None else env
        base = RunPodConfig()
        values: dict[str, object] = {}
        for name, field in (("RUNPOD_CONCURRENCY", "concurrency"), ("RUNPOD_MAX_INLINE_BYTES", "max_inline_bytes"),
                            ("RUNPOD_S3_URL_EXPIRES", "url_expires")):
            text = env.get(name, "").strip()
            if text:
                values[field] = _parse(name, field, text, getattr(base, field))
        if values.get("concurrency", 0) < 0:
            raise ConfigError("RUNPOD_CONCURRENCY must be >= 0 (0 = the engine's stream slots)")
        if values.get("max_inline_bytes", base.max_inline_bytes) < 1024 or values.get("url_expires", 1) < 1:
            raise ConfigError("RUNPOD_MAX_INLINE_BYTES must be >= 1024 and RUNPOD_S3_URL_EXPIRES >= 1")
        mounted = volume if volume.is_dir() else None
        data = env.get("TTS_DATA_DIR", "").strip()
        data_dir = Path(data) if data else (mounted / "voices" if mounted else base.data_dir)
        return replace(base, s3_bucket=env.get("RUNPOD_S3_BUCKET", "").strip() or None, volume=mounted,
                       data_dir=data_dir, progress_updates=bool(env.get("RUNPOD_WEBHOOK_POST_OUTPUT")), **values)

    def engine_defaults(self, env: Mapping[str, str] | None = None) -> dict:
        """With a network volume, the model and the kernel cache live on it unless set explicitly."""
        env = os.environ if env is None else env
        if self.volume is None:
            return {}
        out: dict[str, Path] = {}
        if not env.get("TTS_MODEL_DIR", "").strip():
            out["model_dir"] = self.volume / "models" / "openaudio-s1-mini"
        if not env.get("TTS_CACHE_DIR", "").strip():
            out["cache_dir"] = self.volume / "kernel-cache"
        return out

_DTYPES = ("auto", "bfloat16", "float16", "float32")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _parse(name: str, field: str, text: str, current: object) -> object:
    text = text.strip()
    try:
        if isinstance(current, bool):
            if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError
            return text.lower() in ("1", "true", "yes", "on")
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            return float(text)
        if isinstance(current, Path) or field == "cache_dir":
            return Path(text)
        return text
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r}: expected {type(current).__name__}") from None


def validate(cfg: EngineConfig) -> EngineConfig:
    def fail(field: str, why: str) -> None:
        names = [k for k, (f, _) in ENV_VARS.items() if f == field]
        raise ConfigError(f"{names[0] if names else field}: {why}")

    if cfg.device != "auto" and not (cfg.device == "cpu" or cfg.device == "cuda" or
                                     (cfg.device.startswith("cuda:") and cfg.device[5:].isdigit())):
        fail("device", f"{cfg.device!r} is not one of auto, cpu, cuda, cuda:N")
    for f in ("dtype", "codec_dtype"):
        if getattr(cfg, f) not in _DTYPES:
            fail(f, f"{getattr(cfg, f)!r} is not one of {', '.join(_DTYPES)}")
    if not 50 <= cfg.chunk_length <= 1000:
        fail("chunk_length", f"{cfg.chunk_length} is outside 50..1000")
    if cfg.max_text_length < 1:
        fail("max_text_length", "must be >= 1")
    if not cfg.max_reference_seconds > 0:
        fail("max_reference_seconds", "must be > 0")
    if cfg.reference_cache_size < 0:
        fail("reference_cache_size", "must be >= 0")
    for f in ("max_batch", "max_queue", "kv_cache_tokens", "default_max_new_tokens"):
        if getattr(cfg, f) < 0:
            fail(f, "must be >= 0 (0 = auto)")
    for f in ("prefill_tokens", "first_chunk_frames", "stream_chunk_frames"):
        if getattr(cfg, f) < 1:
            fail(f, "must be >= 1")
    for f in ("cuda_graphs", "compile"):
        if getattr(cfg, f) not in ("auto", "on", "off"):
            fail(f, f"{getattr(cfg, f)!r} is not one of auto, on, off")
    if cfg.codec_compile not in ("on", "off"):
        fail("codec_compile", f"{cfg.codec_compile!r} is not one of on, off")
    for f in ("snake_kernel", "precompile"):
        if getattr(cfg, f) not in ("auto", "off"):
            fail(f, f"{getattr(cfg, f)!r} is not one of auto, off")
    if cfg.quant not in ("bf16", "none", "int8", "int4"):
        fail("quant", f"{cfg.quant!r} is not one of bf16, int8, int4")
    if cfg.int8_kernel not in ("auto", "fused", "tile", "dequant", "off"):
        fail("int8_kernel", f"{cfg.int8_kernel!r} is not one of auto, fused, tile, dequant, off")
    if cfg.log_level.upper() not in _LOG_LEVELS:
        fail("log_level", f"{cfg.log_level!r} is not one of {', '.join(_LOG_LEVELS)}")
    return cfg


@dataclass(frozen=True)
class DownloadConfig:
    hf_token: str | None = None
    model_source: str | None = None  # fetched into TTS_MODEL_DIR at start when that is empty

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> DownloadConfig:
        env = os.environ if env is None else env
        return DownloadConfig(hf_token=env.get("HF_TOKEN") or None,
                              model_source=env.get("TTS_MODEL_SOURCE", "").strip() or None)


def from_env(env: Mapping[str, str] | None = None, **overrides) -> EngineConfig:
    """Builds the config from TTS_* variables; keyword overrides (e.g. from CLI flags) win."""
    env = os.environ if env is None else env
    base = EngineConfig()
    values: dict[str, object] = {}
    for name, (field, _) in ENV_VARS.items():
        if env.get(name, "").strip():
            values[field] = _parse(name, field, env[name], getattr(base, field))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(EngineConfig)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown engine setting(s): {', '.join(sorted(unknown))}")
    return validate(replace(base, **values))
