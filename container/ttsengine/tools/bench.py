"""`python -m ttsengine bench`: concurrency sweep of the serving engine, audio included.

Per level: aggregate frames/s decoded to audio, per-stream frames/s and RTF, time to first audio
p50/p95, VRAM, GPU utilisation and power (NVML), where the engine's time went, and the audio
hours per GPU hour it implies. Writes bench.json and bench.html (plots); `--render bench.json`
rebuilds the HTML from a saved run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import from_env
from ..engine.engine import Engine
from ..engine.loader import load
from ..errors import TTSError
from ..model.quant import weight_bytes
from ..synthesis.request import SynthesisRequest
from . import codec_bench
from . import report as report_page

FRAME_RATE = 44100 / 2048  # frames per second of audio
TEXT = ("The quick brown fox jumps over the lazy dog while the bright sun shines warmly on the quiet "
        "green meadow.")  # 20 words


@dataclass
class Level:
    concurrency: int
    frames_per_stream: int
    wall_s: float
    aggregate_fps: float
    stream_fps_min: float
    stream_fps_p50: float
    rtf_max: float  # processing time / audio time of the slowest stream (< 1 is faster than real time)
    realtime_x_min: float  # audio seconds per wall second of the slowest stream
    ttfa_p50_ms: float
    ttfa_p95_ms: float
    vram_baseline_gb: float
    vram_peak_gb: float
    gpu_util_pct: float | None
    power_w: float | None
    audio_hours_per_gpu_hour: float
    time_step_s: float
    time_prefill_s: float
    time_vocoder_s: float
    steps: int


class NvmlSampler(threading.Thread):
    """Samples GPU utilisation and power every 100 ms (if nvidia-ml-py is installed)."""

    def __init__(self, index: int = 0):
        super().__init__(daemon=True)
        self.util: list[float] = []
        self.power: list[float] = []
        self._halt = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML: report None
            self._nv = None

    def run(self) -> None:
        while self._nv is not None and not self._halt.is_set():
            self.util.append(self._nv.nvmlDeviceGetUtilizationRates(self._h).gpu)
            self.power.append(self._nv.nvmlDeviceGetPowerUsage(self._h) / 1000)
            self._halt.wait(0.1)

    def stop(self) -> tuple[float | None, float | None]:
        self._halt.set()
        self.join(timeout=1)
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        return mean(self.util), mean(self.power)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(engine: Engine, concurrency: int, frames: int, text: str, progress) -> Level:
    cuda = engine.runner.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    m = engine.metrics
    before = (m.step_seconds, m.prefill_seconds, m.vocoder_seconds, m.steps)
    sampler = NvmlSampler()
    sampler.start()
    t0 = time.perf_counter()
    streams = [engine.submit(SynthesisRequest(text=text, seed=i, max_new_tokens=frames), ignore_stop=True)
               for i in range(concurrency)]
    results = []
    for s in streams:
        results.append(s.result())
        progress.update(1)
    wall = time.perf_counter() - t0
    util, power = sampler.stop()
    kept = [r.frames for r in results]
    spans = [s.finished_at - s.submitted_at for s in streams]
    fps = [k / sp for k, sp in zip(kept, spans)]
    ttfa = [s.ttfa * 1000 for s in streams if s.ttfa is not None]
    audio_s = sum(kept) / FRAME_RATE
    after = (m.step_seconds, m.prefill_seconds, m.vocoder_seconds, m.steps)
    return Level(
        concurrency=concurrency, frames_per_stream=frames - 1, wall_s=wall, aggregate_fps=sum(kept) / wall,
        stream_fps_min=min(fps), stream_fps_p50=statistics.median(fps),
        rtf_max=max(sp / (k / FRAME_RATE) for k, sp in zip(kept, spans)), realtime_x_min=min(fps) / FRAME_RATE,
        ttfa_p50_ms=_pct(ttfa, 50), ttfa_p95_ms=_pct(ttfa, 95),
        vram_baseline_gb=base / 1e9, vram_peak_gb=(torch.cuda.max_memory_allocated() if cuda else 0) / 1e9,
        gpu_util_pct=util, power_w=power, audio_hours_per_gpu_hour=audio_s / wall,
        time_step_s=after[0] - before[0], time_prefill_s=after[1] - before[1], time_vocoder_s=after[2] - before[2],
        steps=after[3] - before[3],
    )


def render_html(report: dict) -> str:
    levels = report["levels"]
    c = [lv["concurrency"] for lv in levels]
    fig, axes = report_page.three_axes()
    axes[0].plot(c, [lv["aggregate_fps"] for lv in levels], "o-")
    axes[0].set(title="aggregate frames/s (audio decoded)", xlabel="concurrent streams", xscale="log")
    axes[1].plot(c, [lv["stream_fps_min"] for lv in levels], "o-", label="slowest stream")
    axes[1].plot(c, [lv["stream_fps_p50"] for lv in levels], "o-", label="median stream")
    axes[1].axhline(FRAME_RATE, color="gray", ls="--", label="real time")
    axes[1].axhline(1.2 * FRAME_RATE, color="red", ls=":", label="1.2x real time")
    axes[1].set(title="per-stream frames/s", xlabel="concurrent streams", xscale="log", yscale="log")
    axes[1].legend()
    axes[2].plot(c, [lv["ttfa_p50_ms"] for lv in levels], "o-", label="p50")
    axes[2].plot(c, [lv["ttfa_p95_ms"] for lv in levels], "o-", label="p95")
    axes[2].set(title="time to first audio (ms)", xlabel="concurrent streams", xscale="log")
    axes[2].legend()
    prof = "".join(f"<tr><td>{r['name']}</td><td>{r['ms']:.2f}</td></tr>" for r in report.get("profile") or [])
    return report_page.page("ttsengine bench", report, fig, skip=("levels", "profile"),
                            extra=f"<h2>profile (top kernels, ms)</h2><table border=1>{prof}</table>" if prof else "")


def profile_level(engine: Engine, concurrency: int, frames: int, text: str) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        streams = [engine.submit(SynthesisRequest(text=text, seed=i, max_new_tokens=frames), ignore_stop=True)
                   for i in range(concurrency)]
        for s in streams:
            s.result()
    events = prof.key_averages()
    dev = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:15]
    cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return ([{"name": "GPU " + e.key[:86], "ms": getattr(e, "self_device_time_total", 0) / 1000, "count": e.count}
             for e in dev]
            + [{"name": "CPU " + e.key[:86], "ms": e.self_cpu_time_total / 1000, "count": e.count} for e in cpu])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine bench", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="model dir (default: $TTS_MODEL_DIR)")
    src.add_argument("--random-weights", metavar="NAME", help="random weights with real shapes: s1-mini")
    src.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the HTML report from a bench.json")
    ap.add_argument("--concurrency", default="1,8,32,64,128,256", help="comma-separated levels")
    ap.add_argument("--frames", type=int, default=256, help="frames generated per stream (stop token ignored)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--profile", type=int, metavar="C", help="also profile one run at concurrency C")
    codec = ap.add_argument_group("--codec-only: the streaming codec alone (streams = --concurrency levels)")
    codec.add_argument("--codec-only", action="store_true")
    codec.add_argument("--chunk-frames", type=int, default=8, help="frames per stream per codec call")
    codec.add_argument("--seconds", type=float, default=4.0, help="audio seconds per stream")
    codec.add_argument("--codec-modes", default="snake", help=f"comma-separated: {', '.join(codec_bench.MODES)}")
    codec.add_argument("--no-graphs", action="store_true", help="codec without CUDA graphs")
    codec.add_argument("--profile-mode", help="top GPU kernels of this mode")
    args = ap.parse_args(argv)
    if args.codec_only:
        return _codec_only(args)
    if args.render:
        report = json.loads(args.render.read_text())
        (args.render.parent / "bench.html").write_text(render_html(report))
        print(f"wrote {args.render.parent / 'bench.html'}")
        return 0
    from tqdm import tqdm

    levels = [int(x) for x in args.concurrency.split(",")]
    config = from_env(model_dir=args.model, max_batch=max(levels))
    t0 = time.perf_counter()
    ckpt = load(config, args.random_weights)
    load_s = time.perf_counter() - t0
    engine = Engine(ckpt, config)
    engine.start()
    engine.settle()  # steady state: the lazily captured graphs first (a server captures them while idle)
    try:
        engine.submit(SynthesisRequest(text=args.text, seed=0, max_new_tokens=24), ignore_stop=True).result()
        results = []
        with tqdm(total=sum(levels), desc="streams", unit="stream") as bar:
            for c in levels:
                results.append(run_level(engine, c, args.frames, args.text, bar))
        profile = profile_level(engine, args.profile, min(args.frames, 64), args.text) if args.profile else None
    finally:
        engine.close()
    ok = [lv.concurrency for lv in results if lv.realtime_x_min >= 1.2]
    report = {
        "device": torch.cuda.get_device_name() if engine.runner.device.type == "cuda" else "cpu",
        "torch": torch.__version__, "model": args.random_weights or str(config.model_dir),
        "dtype": str(engine.runner.dtype), "compile": engine.compiled, "cuda_graphs": engine.graphs is not None,
        "compile_error": engine.compile_error, "load_s": round(load_s, 2), "warmup_s": round(engine.warmup_seconds, 2),
        "kernel_cache": engine.kernel_cache.status, "precompiled": engine.precompiled,
        "quantization": ckpt.quantization,
        "weights_gb": round((weight_bytes(ckpt.model) + weight_bytes(ckpt.codec)) / 1e9, 3),
        "first_chunk_frames": engine.settings.first_chunk_frames,
        "stream_chunk_frames": engine.settings.stream_chunk_frames,
        "kv_positions": engine.kv_positions,
        "max_concurrency_at_1.2x_realtime": max(ok) if ok else None,
        "levels": [asdict(lv) for lv in results], "profile": profile,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench.html").write_text(render_html(report))
    print_table(report)
    return 0


def _codec_only(args) -> int:
    config = from_env(model_dir=args.model)
    ckpt = load(config, args.random_weights)
    modes = args.codec_modes.split(",")
    unknown = sorted({m.partition("+")[0] for m in modes} - set(codec_bench.MODES))
    if unknown:
        raise TTSError(f"--codec-modes: unknown {', '.join(unknown)} (known: {', '.join(codec_bench.MODES)})")
    print(f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'} | torch {torch.__version__} | "
          f"codec {ckpt.codec.cfg.decoder_dim} dim, dtype {next(ckpt.codec.parameters()).dtype}", flush=True)
    codec_bench.run(ckpt.codec, [int(x) for x in args.concurrency.split(",")], args.chunk_frames, args.seconds,
                    modes, not args.no_graphs, args.profile_mode, args.out)
    return 0


def print_table(report: dict) -> None:
    print(f"\n{report['device']} | torch {report['torch']} | {report['model']} | {report['dtype']} | "
          f"compile {report['compile']} | graphs {report['cuda_graphs']} | warm-up {report['warmup_s']} s | "
          f"cache {report['kernel_cache']} | quant {report['quantization']} | weights {report['weights_gb']} GB")
    cols = ("concurrency", "aggregate_fps", "stream_fps_min", "realtime_x_min", "ttfa_p50_ms", "ttfa_p95_ms",
            "vram_peak_gb", "gpu_util_pct", "power_w", "audio_hours_per_gpu_hour", "time_step_s", "time_prefill_s",
            "time_vocoder_s")
    print(" | ".join(cols))
    for lv in report["levels"]:
        print(" | ".join(report_page.fmt(lv[c]) for c in cols))
    print(f"highest concurrency with every stream >= 1.2x real time: {report['max_concurrency_at_1.2x_realtime']}")
    for row in report.get("profile") or []:
        print(f"  {row['ms']:10.2f} ms  x{row.get('count', '')}  {row['name']}")


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except TTSError as e:
        raise SystemExit(f"ttsengine bench: {e}") from None
