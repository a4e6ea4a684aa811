"""`--write-checkpoint DIR` of `warm` and `bench`: the random weights of `--random-weights NAME` written as a
real-format model directory (model/loading/checkpoint_writer.py), then loaded from there like a real model, so the
measurement reads real-size files (model.pth 1.7 GB bf16, codec.pth 1.87 GB fp32 for s1-mini)."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from ..config import EngineConfig
from ..errors import ConfigError

log = logging.getLogger(__name__)


def add_write_checkpoint(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--write-checkpoint", type=Path, metavar="DIR",
                    help="with --random-weights: write them into DIR (new or empty) in the real checkpoint format "
                         "(config.json, tokenizer files, model.pth, codec.pth), then load them from there")


def write_if_asked(args: argparse.Namespace, config: EngineConfig) -> tuple[EngineConfig, str | None, float | None]:
    """-> (the config to load with, the random-weights name still to generate, seconds spent writing).
    With --write-checkpoint the weights are written and the config points at them; nothing is left to generate."""
    if args.write_checkpoint is None:
        return config, args.random_weights, None
    if not args.random_weights:
        raise ConfigError("--write-checkpoint needs --random-weights NAME (the weights to write)")
    from ..engine.loader import resolve_device
    from ..model.loading.checkpoint_writer import write_random_checkpoint

    start = time.perf_counter()
    # drawn on the engine's device (a GPU draws the real size in a second; the files are the same format)
    path = write_random_checkpoint(args.random_weights, args.write_checkpoint, resolve_device(config.device))
    seconds = time.perf_counter() - start
    log.info("wrote random %s weights to %s in %.1f s", args.random_weights, path, seconds)
    return config.with_(model_dir=path), None, round(seconds, 2)
