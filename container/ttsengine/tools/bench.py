"""`python -m ttsengine bench`: concurrency sweep of the serving engine, audio included.

Per level: aggregate frames/s decoded to audio, per-stream frames/s and RTF, time to first audio
p50/p95, VRAM, GPU utilisation and power (NVML), where the engine's time went, and the audio
hours per GPU hour it implies. Writes bench.json and bench.html (plots); `--render bench.json`
rebuilds the HTML from a saved run. --engine-process on: the engines in one engine process per GPU behind this
process, as the server runs them (tools/bench_fleet.py); off (default): in this process, the old figures' layout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..config import from_env
from ..engine import features
from ..engine.loader import load
from ..engine.placement import engine_configs
from ..engine.settings import codec_switches, features_on, platform
from ..engine.stats import EngineStats
from ..errors import TTSError
from ..synthesis.plan import Plan
from ..synthesis.request import Reference, SynthesisRequest
from . import codec_bench
from . import report as report_page
from .audio_check import MIN_SNR_DB, compare, sampled
from .bench_fleet import IN_PROCESS_ONLY, BenchFleet, cuda_count
from .checkpoint_flag import add_write_checkpoint, write_if_asked
from .load.schedule import poisson_rate
from .load.summary import pct
from .timeline import Timeline, timeline

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
    stall_p95_ms: float  # a listener's total wait for audio after playback started (Stream.stalls), p95 of streams
    stall_max_ms: float
    vram_baseline_gb: float  # torch's allocated bytes on the busiest GPU (engine processes: as their stats report it)
    vram_peak_gb: float | None  # torch's peak there in the level; None: engine processes (see vram_used_peak_gb)
    gpu_util_pct: float | None
    power_w: float | None
    audio_hours_per_gpu_hour: float
    time_step_s: float
    time_prefill_s: float
    time_vocoder_s: float
    time_host_s: float  # the engine loops' own host time: iterations less their waits for steps (EngineStats),
    #                     summed over the engines (per_engine has each engine's)
    steps: int
    prefill_tokens_per_request: float
    arrival_rate: float | None  # requests per second (Poisson), None: all submitted at once
    rejected: int  # requests refused as busy (queue full)
    per_engine: list[dict]  # each engine's device(s), streams completed and frames/s decoded to audio
    audio_checked: int = 0  # streams whose audio was compared with a whole decode of their codes (--check-audio)
    audio_snr_min_db: float | None = None  # the lowest of their SNRs (tools/audio_check.py)
    audio_failures: int = 0  # checked streams below MIN_SNR_DB or of the wrong length
    audio_wrong_length: int = 0  # of those, streams whose audio was not their codes' length
    vram_used_peak_gb: float | None = None  # NVML: device memory in use by every process, busiest GPU (None: no NVML)


class NvmlSampler(threading.Thread):
    """Samples GPU utilisation (mean over `indices`), power (their sum) and memory in use (the most on one of them)
    every 100 ms (if nvidia-ml-py is installed)."""

    def __init__(self, indices: tuple[int, ...] = (0,)):
        super().__init__(daemon=True)
        self.util: list[float] = []
        self.power: list[float] = []
        self.used_peak: int | None = None  # bytes
        self._halt = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv, self._hs = pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        except Exception:  # noqa: BLE001 - no NVML: report None
            self._nv = None

    def run(self) -> None:
        while self._nv is not None and not self._halt.is_set():
            self.util.append(statistics.fmean(self._nv.nvmlDeviceGetUtilizationRates(h).gpu for h in self._hs))
            self.power.append(sum(self._nv.nvmlDeviceGetPowerUsage(h) for h in self._hs) / 1000)
            used = max(self._nv.nvmlDeviceGetMemoryInfo(h).used for h in self._hs)
            self.used_peak = max(used, self.used_peak or 0)
            self._halt.wait(0.1)

    def stop(self) -> tuple[float | None, float | None]:
        self._halt.set()
        self.join(timeout=1)
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        return mean(self.util), mean(self.power)


@dataclass(frozen=True)
class Load:
    """How a level's requests are made and sent."""

    frames: int  # frames generated per stream (stop token ignored)
    text: str
    reference: Reference | None = None  # --voice: the same stored voice on every stream
    arrival_rate: float | None = None  # --arrivals poisson:RATE: requests per second (None: all at once)
    check_audio: int = 0  # --check-audio: streams per level that keep their codes for the audio check

    def request(self, i: int) -> SynthesisRequest:
        refs = (self.reference,) if self.reference is not None else ()
        return SynthesisRequest(text=self.text, seed=i, max_new_tokens=self.frames, references=refs)

    def arrival_times(self, n: int) -> list[float]:
        """Seconds after the level's start at which each request is sent (Poisson: exponential gaps, seeded)."""
        if not self.arrival_rate:
            return [0.0] * n
        gaps = np.random.default_rng(0).exponential(1.0 / self.arrival_rate, n)
        return list(np.cumsum(gaps) - gaps[0])


def run_level(fleet: BenchFleet, concurrency: int, load: Load, progress) -> Level:
    """One level over the engines in this process or in engine processes (BenchFleet: the same figures from both)."""
    devices = fleet.gpus
    base = fleet.reset_peak()
    before = fleet.engines()
    sampler = NvmlSampler(devices or (0,))
    sampler.start()
    t0 = time.perf_counter()
    checked = set(sampled(concurrency, load.check_audio))
    refusals = []

    def request_of(i: int) -> SynthesisRequest | Plan:
        request = load.request(i)
        return fleet.kept(request) if i in checked else request  # planned here so the plan keeps its codes

    def refused() -> None:
        refusals.append(1)
        progress.update(1)

    streams = fleet.submit_all(load.arrival_times(concurrency), request_of, t0, refused)
    rejected = len(refusals)
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
    stalls = [s.stalls() * 1000 for s in streams]
    audio_s = sum(kept) / FRAME_RATE
    level_stats = [e.since(b) for e, b in zip(fleet.engines(), before)]  # each engine's counters in the level
    per_engine = [{"device": d.device, "codec_device": d.codec_device, "streams": d.requests_done,
                   "frames_per_second": round(d.vocoded_frames / wall, 1),
                   "time_host_s": round(d.loop_seconds - d.step_wait_seconds, 3)} for d in level_stats]
    total = EngineStats.sum(level_stats).total
    peak = fleet.peak()
    level = Level(
        concurrency=concurrency, frames_per_stream=load.frames - 1, wall_s=wall, aggregate_fps=sum(kept) / wall,
        stream_fps_min=min(fps), stream_fps_p50=statistics.median(fps),
        rtf_max=max(sp / (k / FRAME_RATE) for k, sp in zip(kept, spans)), realtime_x_min=min(fps) / FRAME_RATE,
        ttfa_p50_ms=pct(ttfa, 50), ttfa_p95_ms=pct(ttfa, 95),
        stall_p95_ms=pct(stalls, 95), stall_max_ms=max(stalls),
        vram_baseline_gb=base / 1e9,
        vram_peak_gb=None if peak is None else peak / 1e9,
        vram_used_peak_gb=None if sampler.used_peak is None else sampler.used_peak / 1e9,
        gpu_util_pct=util, power_w=power, audio_hours_per_gpu_hour=audio_s / wall / max(1, len(devices)),
        time_step_s=total.step_seconds, time_prefill_s=total.prefill_seconds, time_vocoder_s=total.vocoder_seconds,
        time_host_s=total.loop_seconds - total.step_wait_seconds, steps=total.steps,
        prefill_tokens_per_request=total.prefill_tokens / max(1, len(streams)), arrival_rate=load.arrival_rate,
        rejected=rejected, per_engine=per_engine,
    )
    # after the level's figures (its VRAM peak included): the checks' whole decodes are not the engine's work
    try:
        checks = [compare(r.audio, fleet.whole(s)) for s, r in zip(streams, results) if s.plan.keep_codes]
    except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError from 2.5; this name on 2.2 too)
        print(f"audio check skipped at {concurrency} streams: no GPU memory left for a whole decode of "
              f"{load.frames} frames (use fewer --frames, or --check-audio 0)", flush=True)
        return level
    return replace(level, audio_checked=len(checks), audio_snr_min_db=min((c.snr_db for c in checks), default=None),
                   audio_failures=sum(not c.ok for c in checks),
                   audio_wrong_length=sum(c.samples != c.expected for c in checks))


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


def profile_level(engine: BenchFleet, concurrency: int, load: Load) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        streams = [engine.submit(load.request(i), ignore_stop=True) for i in range(concurrency)]
        for s in streams:
            s.result()
    # kernels and copies only (not the GPU-side ranges of user annotations), per device and stream
    kernels = [(e.time_range.start, e.time_range.end, f"cuda:{e.device_index} stream {e.device_resource_id}")
               for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    events = prof.key_averages()
    dev = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:15]
    cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return (timeline_rows(timeline(kernels))
            + [{"name": "GPU " + e.key[:86], "ms": getattr(e, "self_device_time_total", 0) / 1000, "count": e.count}
               for e in dev]
            + [{"name": "CPU " + e.key[:86], "ms": e.self_cpu_time_total / 1000, "count": e.count} for e in cpu])


def timeline_rows(t: Timeline) -> list[dict]:
    """The profile's rows saying how the GPU's time was shared among its streams (tools/timeline.py)."""
    rows = [{"name": "GPU time, first kernel to last", "ms": t.span_us / 1000, "count": ""},
            {"name": "GPU busy (any stream)", "ms": t.busy_us / 1000, "count": ""},
            {"name": "GPU busy on two or more streams at once", "ms": t.shared_us / 1000, "count": ""}]
    return rows + [{"name": f"GPU {st.stream} busy (its kernels' own time: {st.kernel_us / 1000:.2f} ms)",
                    "ms": st.busy_us / 1000, "count": st.kernels} for st in t.streams]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="model dir (default: $TTS_MODEL_DIR)")
    src.add_argument("--random-weights", metavar="NAME", help="random weights with real shapes: s1-mini")
    src.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the HTML report from a bench.json")
    ap.add_argument("--concurrency", default="1,8,32,64,128,256", help="comma-separated levels")
    ap.add_argument("--frames", type=int, default=256, help="frames generated per stream (stop token ignored)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--profile", type=int, metavar="C", help="also profile one run at concurrency C")
    ap.add_argument("--voice", type=float, metavar="SECONDS",
                    help="every stream uses one stored voice of this many seconds of random audio")
    ap.add_argument("--arrivals", metavar="poisson:RATE",
                    help="open-loop arrivals: each level's requests sent at RATE per second (Poisson), not all at once")
    ap.add_argument("--check-audio", type=int, metavar="N",
                    help="per level, N streams' delivered audio is compared with a whole decode of the codes they "
                         f"generated (below {MIN_SNR_DB:g} dB SNR: exit 1); 0: off (default: 4; 0 with "
                         "--engine-process on, which cannot check)")
    ap.add_argument("--devices", help="one engine per entry, e.g. cuda:0,cuda:1 (default: $TTS_DEVICES); levels count "
                                      "streams over all engines, each engine gets a share of the largest as slots")
    ap.add_argument("--topology", choices=("replicas", "split"), help="default: $TTS_TOPOLOGY")
    ap.add_argument("--engine-process", choices=("off", "on"), default="off",
                    help="on: one engine process per GPU behind this process, as the server runs them "
                         "(TTS_ENGINE_PROCESS); off (default): the engines in this process")
    add_write_checkpoint(ap)
    codec = ap.add_argument_group("--codec-only: the streaming codec alone (streams = --concurrency levels)")
    codec.add_argument("--codec-only", action="store_true")
    codec.add_argument("--chunk-frames", type=int, default=8, help="frames per stream per codec call")
    codec.add_argument("--seconds", type=float, default=4.0, help="audio seconds per stream")
    codec.add_argument("--codec-modes", default="engine",
                       help=f"comma-separated: engine (default: the codec built as the engine builds it from this "
                            f"environment's TTS_* settings: layout, Snake kernel, compile, cuDNN tuning, graphs of up "
                            f"to 64 rows), {', '.join(codec_bench.MODES)} (each of these may end in +cudnn or +tuned)")
    codec.add_argument("--no-graphs", action="store_true",
                       help="codec without CUDA graphs (as with TTS_FEATURES=-cuda_graphs)")
    codec.add_argument("--profile-mode", help="top GPU kernels of this mode")
    args = ap.parse_args(argv)
    try:  # the same spelling as loadtest's (tools/load/schedule.py); `closed` there means all at once here
        rate = poisson_rate(args.arrivals)
    except ValueError as e:
        raise TTSError(str(e)) from None
    if args.voice is not None and not 0 < args.voice <= 60:
        raise TTSError(f"--voice {args.voice:g}: give seconds in (0, 60]")
    if args.check_audio is not None and args.check_audio < 0:
        raise TTSError(f"--check-audio {args.check_audio}: give a number of streams >= 0")
    in_process = args.engine_process == "off"
    if not in_process and args.check_audio:
        raise TTSError(f"--check-audio {args.check_audio} needs the engines in this process (a whole decode by the "
                       "engine's codec): use --engine-process off, or --check-audio 0")
    if not in_process and args.profile:
        raise TTSError("--profile needs the engines in this process (the profiler sees only its own process): use "
                       "--engine-process off")
    check_audio = (4 if in_process else 0) if args.check_audio is None else args.check_audio
    if args.codec_only:
        return _codec_only(args)
    if args.render:
        report = json.loads(args.render.read_text())
        (args.render.parent / "bench.html").write_text(render_html(report))
        print(f"wrote {args.render.parent / 'bench.html'}")
        return 0
    from tqdm import tqdm

    levels = [int(x) for x in args.concurrency.split(",")]
    config = from_env(model_dir=args.model, devices=args.devices, topology=args.topology)
    config, random_weights, write_s = write_if_asked(args, config)
    engines = len(engine_configs(config, cuda_count()))
    config = config.with_(max_batch=-(-max(levels) // engines))
    fleet = BenchFleet.start(config, random_weights, engine_process=not in_process)
    try:
        reference = fleet.random_voice(args.voice, TEXT.rstrip(".").split()) if args.voice else None
        load_ = Load(args.frames, args.text, reference, rate, check_audio)
        warm = [fleet.submit(Load(24, args.text, reference).request(i), ignore_stop=True) for i in range(engines)]
        for s in warm:
            s.result()
        results = []
        with tqdm(total=sum(levels), desc="streams", unit="stream") as bar:
            for c in levels:
                results.append(run_level(fleet, c, load_, bar))
        profile = profile_level(fleet, args.profile, Load(min(args.frames, 192), args.text, reference)) \
            if args.profile else None
        stats = fleet.fleet.stats()
        settings = fleet.settings()
    finally:
        fleet.close()
    ok = [lv.concurrency for lv in results if lv.realtime_x_min >= 1.2]
    first = stats.engines[0]  # the settings the report names: the first engine's
    report = {
        **settings, "engine_process": args.engine_process,
        "submit": "event loop" if fleet.direct else "one after another",
        "in_process_only": None if in_process else f"{', '.join(IN_PROCESS_ONLY)}: None, read from an engine in this "
                                                    "process (the engines ran in engine processes)",
        "torch": torch.__version__, "model": random_weights or str(config.model_dir), "write_checkpoint_s": write_s,
        "compile": first.compiled, "cuda_graphs": first.cuda_graphs,
        "load_s": round(fleet.load_s, 2),  # engine processes: their warm-up included
        "warmup_s": round(stats.total.warmup_seconds, 2),
        "kernel_cache": first.kernel_cache, "precompiled": first.precompiled, "quantization": first.quantization,
        "kv_positions": first.kv_positions, "memory_preset": first.memory_preset.as_dict(),
        "voice_seconds": args.voice, "voice_prompt_tokens": int(reference.codes.shape[1]) if reference else 0,
        "arrivals": args.arrivals, "topology": config.topology,
        "engines": [e.device + (f"+{e.codec_device}" if e.codec_device != e.device else "") for e in stats.engines],
        "max_concurrency_at_1.2x_realtime": max(ok) if ok else None,
        "levels": [asdict(lv) for lv in results], "profile": profile,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench.html").write_text(render_html(report))
    print_table(report)
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.html'}")
    bad = [lv for lv in results if lv.audio_failures]
    for lv in bad:
        print(f"audio check FAILED at {lv.concurrency} streams: {lv.audio_failures} of {lv.audio_checked} checked "
              f"streams delivered audio that is not their codes' (lowest SNR {lv.audio_snr_min_db:.1f} dB, "
              f"need {MIN_SNR_DB:g}; {lv.audio_wrong_length} of the wrong length)")
    return 1 if bad else 0


def _codec_only(args) -> int:
    config, random_weights, _ = write_if_asked(args, from_env(model_dir=args.model))
    ckpt = load(config, random_weights)
    cuda = next(ckpt.codec.parameters()).device.type == "cuda"  # TTS_DEVICE=cpu on a GPU host: the CPU's codec
    if args.no_graphs:  # as with TTS_FEATURES=-cuda_graphs, for the engine's switches too
        config = config.with_(features=features.normalise(f"{config.features},-{features.CUDA_GRAPHS}"))
    on = features_on(config, platform(next(ckpt.codec.parameters()).device, False))
    graphs = features.CUDA_GRAPHS in on
    switches = codec_switches(on)
    modes = args.codec_modes.split(",")
    known = (codec_bench.ENGINE, *codec_bench.MODES)
    unknown = sorted({m.partition("+")[0] for m in modes} - set(known))
    if unknown:
        raise TTSError(f"--codec-modes: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    if any(m.startswith(codec_bench.ENGINE + "+") for m in modes):
        raise TTSError("--codec-modes: engine takes no +option (its cuDNN tuning is the engine's: TTS_FEATURES)")
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu'} | torch {torch.__version__} | "
          f"codec {ckpt.codec.cfg.decoder_dim} dim, dtype {next(ckpt.codec.parameters()).dtype} | engine: "
          f"{switches.describe()}, graphs {'on' if graphs else 'off'}", flush=True)
    codec_bench.run(ckpt.codec, [int(x) for x in args.concurrency.split(",")], args.chunk_frames, args.seconds,
                    modes, graphs, args.profile_mode, args.out, switches)
    return 0


def print_table(report: dict) -> None:
    print(f"\n{report['device']} | torch {report['torch']} | {report['model']} | {report['dtype']} | "
          f"compile {report['compile']} | graphs {report['cuda_graphs']} | warm-up {report['warmup_s']} s | "
          f"cache {report['kernel_cache']} | quant {report['quantization']} | weights {report['weights_gb']} GB")
    print(f"engines {', '.join(report.get('engines') or [])} ({report.get('topology')}) | "
          f"memory preset {report.get('memory_preset')} | KV positions {report.get('kv_positions')} | voice "
          f"{report.get('voice_seconds') or 'none'} s ({report.get('voice_prompt_tokens')} tokens) | arrivals "
          f"{report.get('arrivals') or 'all at once'}")
    cols = ("concurrency", "aggregate_fps", "stream_fps_min", "realtime_x_min", "ttfa_p50_ms", "ttfa_p95_ms",
            "stall_p95_ms", "stall_max_ms",
            "vram_peak_gb", "gpu_util_pct", "power_w", "audio_hours_per_gpu_hour", "time_step_s", "time_prefill_s",
            "time_vocoder_s", "time_host_s", "prefill_tokens_per_request", "rejected", "audio_snr_min_db")
    print(" | ".join(cols))
    for lv in report["levels"]:
        print(" | ".join(report_page.fmt(lv.get(c)) for c in cols))
        if len(lv.get("per_engine") or []) > 1:
            print("    per engine: " + " | ".join(
                f"{e['device']}{'+' + e['codec_device'] if e['codec_device'] != e['device'] else ''} "
                f"{e['streams']} streams {e['frames_per_second']:,.0f} fps" for e in lv["per_engine"]))
    print(f"highest concurrency with every stream >= 1.2x real time: {report['max_concurrency_at_1.2x_realtime']}")
    for row in report.get("profile") or []:
        print(f"  {row['ms']:10.2f} ms  x{row.get('count', '')}  {row['name']}")


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except TTSError as e:
        raise SystemExit(f"ttsengine bench: {e}") from None
