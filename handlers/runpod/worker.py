"""`python -m handlers runpod [RunPod flags]`: loads and warms the engine, then hands the job handler
to RunPod's worker loop. RunPod's own flags pass through (`--rp_serve_api --rp_api_port 8000` runs
its local test API). With a network volume at /runpod-volume, the model (models/openaudio-s1-mini),
the kernel cache (kernel-cache/) and stored voices (voices/) live there unless set explicitly.
"""

from __future__ import annotations

import logging
import sys

from ttsengine import DownloadConfig, Engine, EngineConfig, RunPodConfig, TTSError, VoiceStore, ensure_model, from_env

from .handler import JobHandler

log = logging.getLogger("handlers.runpod")


def build(cfg: RunPodConfig, engine_config: EngineConfig) -> JobHandler:
    dl = DownloadConfig.from_env()
    if dl.model_source:  # first start on a fresh network volume: fetch once, keep it there
        ensure_model(engine_config.model_dir, dl.model_source, dl.hf_token)
    engine = Engine.load(engine_config)  # returns once warmed up
    voices = VoiceStore(cfg.data_dir, engine.voice_codes, engine.codec_tag, engine.frame_rate)
    progress = None
    if cfg.progress_updates:
        from runpod.serverless import progress_update as progress
    return JobHandler(engine, voices, cfg, progress)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = RunPodConfig.from_env()
        engine_config = from_env(**cfg.engine_defaults())  # read once: logging and the engine
    except TTSError as e:
        print(f"handlers runpod: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=engine_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import runpod
    except ImportError:
        print("handlers runpod: the runpod package is missing (pip install 'fish-tts-server[runpod]')",
              file=sys.stderr)
        return 2
    try:
        handler = build(cfg, engine_config)
    except TTSError as e:
        print(f"handlers runpod: {e}", file=sys.stderr)
        return 1
    log.info("worker ready: concurrency %d, inline limit %d bytes, bucket %s, volume %s",
             handler.concurrency(0), cfg.max_inline_bytes, cfg.s3_bucket or "-", cfg.volume or "-")
    sys.argv = [sys.argv[0], *argv]  # RunPod parses its flags (--rp_serve_api, ...) from sys.argv
    try:
        runpod.serverless.start({"handler": handler.run, "return_aggregate_stream": True,
                                 "concurrency_modifier": handler.concurrency})
    finally:
        handler.engine.close()
    return 0
