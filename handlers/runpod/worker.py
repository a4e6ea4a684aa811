"""`python -m handlers runpod [RunPod flags]`: loads and warms the engine, then hands the job handler
to RunPod's worker loop. RunPod's own flags pass through (`--rp_serve_api --rp_api_port 8000` runs
its local test API). With a network volume at /runpod-volume, the model (models/openaudio-s1-mini),
the kernel cache (kernel-cache/) and stored voices (voices/) live there unless set explicitly.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ttsengine import DownloadConfig, EngineConfig, RunPodConfig, TTSError, from_env
from ttsengine.serving import chunk_trace, switches
from ttsengine.serving.service import Service, engine_loader, setup_logging

from .drain import Drain
from .handler import JobHandler
from .pickup import installed

log = logging.getLogger("handlers.runpod")
VOLUME = Path("/runpod-volume")  # where RunPod mounts an endpoint's network volume


def volume_defaults(volume: Path | None) -> tuple[dict, dict]:
    """-> (engine, worker) config defaults that put the model, the kernel cache and the voices on a mounted
    network volume; the TTS_* variables still win."""
    if volume is None:
        return {}, {}
    return ({"model_dir": volume / "models" / "openaudio-s1-mini", "cache_dir": volume / "kernel-cache"},
            {"data_dir": volume / "voices"})


def build(cfg: RunPodConfig, engine_config: EngineConfig, download: DownloadConfig) -> JobHandler:
    """The warm engine (fetched first from TTS_MODEL_SOURCE onto a fresh volume) behind the job handler."""
    service = Service(engine_loader(engine_config, download), cfg.data_dir, engine_config.features).load()
    waited = service.settle(cfg.ready_when, cfg.ready_max_wait)  # a scale-out's first jobs meet full speed (issue 44)
    if waited >= 1:
        log.info("settled: waited %.1f s for the lazily captured graphs", waited)
    progress = None
    if cfg.progress_updates:
        from runpod.serverless import progress_update as progress
    return JobHandler(service, service.voices, cfg, progress, Drain(service, cfg.drain_seconds),
                      coalesce=switches.runpod_coalesce(engine_config.features))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    volume = VOLUME if VOLUME.is_dir() else None
    engine_defaults, worker_defaults = volume_defaults(volume)
    try:  # read once: logging, the engine, the worker
        cfg = RunPodConfig.from_env(defaults=worker_defaults)
        engine_config = from_env(defaults=engine_defaults)
        download = DownloadConfig.from_env()
    except TTSError as e:
        print(f"handlers runpod: {e}", file=sys.stderr)
        return 2
    setup_logging(engine_config.log_level)
    chunk_trace.enable(cfg.trace_chunks)  # a streamed job's chunks timed: one log line each (handler.py)
    try:
        import runpod
    except ImportError:
        print("handlers runpod: the runpod package is missing (pip install 'fish-tts-server[runpod]')",
              file=sys.stderr)
        return 2
    from runpod.serverless.modules.rp_logger import RunPodLogger

    # the SDK's default, DEBUG, prints three lines per streamed item (hundreds a second under load, 7% of the
    # worker's main thread at 256 jobs): INFO unless the endpoint asks for a level
    RunPodLogger().set_level(cfg.sdk_log_level or cfg.sdk_debug_level or "INFO")
    try:
        handler = build(cfg, engine_config, download)
    except TTSError as e:
        print(f"handlers runpod: {e}", file=sys.stderr)
        return 1
    log.info("worker ready: concurrency %d, inline limit %d bytes, bucket %s, volume %s",
             handler.concurrency(0), cfg.max_inline_bytes, cfg.s3_bucket or "-", volume or "-")
    sys.argv = [sys.argv[0], *argv]  # RunPod parses its flags (--rp_serve_api, ...) from sys.argv
    try:
        # the aggregate is all jobs' or none's: the SDK decides once for the one generator that serves every job
        with installed(switches.runpod_pickup(engine_config.features)) as prompt:
            log.info("job pickup: %s", "as soon as fetched (runpod_pickup)" if prompt else "the SDK's own loop")
            runpod.serverless.start({"handler": handler.run, "return_aggregate_stream": cfg.aggregate_stream,
                                     "concurrency_modifier": handler.concurrency})
    finally:
        handler.engine.close()
    return 0
