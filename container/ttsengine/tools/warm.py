"""`python -m ttsengine warm`: compile and capture everything the server uses, synthesize once, and
write the kernel cache (TTS_CACHE_DIR) including its portable blob. Prints one JSON line with the
timings, measured from process start (weight load included)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..config import from_env
from ..engine.engine import Engine
from ..engine.loader import load
from ..errors import ConfigError
from ..model.loading.codec_cache import wait_for_writers
from ..synthesis.request import SynthesisRequest
from .checkpoint_flag import add_write_checkpoint, write_if_asked

_TEXT = "Hello there, this is a warm-up sentence."


def process_age() -> float:
    """Seconds since this process started (Linux /proc), else since this module was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        import os

        return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    imports_s = process_age()  # interpreter start and the imports up to here: the part of a start before the load
    ap = argparse.ArgumentParser(prog="python -m ttsengine warm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="model dir (default: $TTS_MODEL_DIR)")
    src.add_argument("--random-weights", metavar="NAME", help="random weights with real shapes: s1-mini")
    ap.add_argument("--cache-dir", type=Path, help="kernel cache directory (default: $TTS_CACHE_DIR)")
    ap.add_argument("--no-blob", action="store_true", help="do not write the portable cache blob")
    ap.add_argument("--until-first-audio", action="store_true",
                    help="a start measurement: stop once the warm-up request is done, without capturing the graphs "
                         "left for later (they add no kernels: the blob is the same), so a run costs its start")
    add_write_checkpoint(ap)
    args = ap.parse_args(argv)
    config = from_env(model_dir=args.model, cache_dir=args.cache_dir)
    if config.cache_dir is None:
        raise ConfigError("warm needs a cache directory: set TTS_CACHE_DIR or pass --cache-dir")
    config, random_weights, write_s = write_if_asked(args, config)
    t0 = time.perf_counter()
    ckpt = load(config, random_weights)
    load_s = time.perf_counter() - t0
    engine = Engine(ckpt, config)
    engine.start()
    try:
        stream = engine.submit(SynthesisRequest(text=_TEXT, seed=0, max_new_tokens=16), ignore_stop=True)
        next(iter(stream))
        first_audio = process_age()
        compiler_imported = "torch._dynamo" in sys.modules  # ~1 s of a start when it is (feature lazy_compiler)
        stream.result()
        if not args.until_first_audio:
            engine.settle()  # the graphs captured after ready use no new kernels, but warm promises everything
        blob = None if args.no_blob else engine.kernel_cache.save()
        stats = engine.stats()
    finally:
        engine.close()
        wait_for_writers()  # the codec cache's entry too: warm leaves a complete cache
    print(json.dumps({
        "process_to_first_audio_s": round(first_audio, 2), "imports_s": round(imports_s, 2), "load_s": round(load_s, 2),
        "load_phases": ckpt.load_phases, "compiler_at_first_audio": compiler_imported,
        "model": f"random weights ({random_weights})" if random_weights else str(config.model_dir),
        "write_checkpoint_s": write_s, "codec_cache": ckpt.codec_cache,
        "warmup_s": round(stats.warmup_seconds or 0.0, 2), "kernel_cache": stats.kernel_cache,
        "precompiled": stats.precompiled,
        "compiled": stats.compiled, "cuda_graphs": stats.cuda_graphs,
        "quantization": stats.quantization, "blob": str(blob) if blob else None,
        "blob_mb": round(blob.stat().st_size / 1e6, 1) if blob else None, "torch": torch.__version__,
    }))
    return 0
