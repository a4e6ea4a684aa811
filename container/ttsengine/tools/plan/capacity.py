"""What one instance (one GPU, one engine) holds: from a bench or loadtest JSON, or from the GPU's memory preset.

A measured level counts when every stream stayed at REALTIME_MARGIN x real time or faster (bench's rule for its
`max_concurrency_at_1.2x_realtime`); its first-audio p95 and slowest stream make the curve the simulation reads
at any load per instance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...engine.presets import Preset, by_name
from ...errors import ConfigError, TTSError

REALTIME_MARGIN = 1.2  # every stream this much faster than real time: a stream never runs dry with a little jitter


@dataclass(frozen=True)
class Point:
    """One measured level."""

    concurrency: int
    realtime_x: float  # audio seconds per wall second of the slowest stream
    first_audio_p95_ms: float | None


@dataclass(frozen=True)
class Capacity:
    preset: Preset  # the GPU's memory preset (the engine's slots unless TTS_MAX_BATCH says)
    streams: int  # streams one instance holds at REALTIME_MARGIN x real time
    source: str  # "measured (bench)", "measured (loadtest)", "measured (bench, loadtest)" or "preset"
    curve: tuple[Point, ...] = ()  # measured levels by concurrency; empty for a preset
    ready_s: float | None = None  # bench: the engine's load + warm-up (its start once the instance runs)
    notes: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        return bool(self.curve)


def read_json(path: Path, flag: str) -> dict:
    try:
        report = json.loads(Path(path).read_text())
    except OSError as e:
        raise TTSError(f"{flag} {path}: {e.strerror}") from None
    except ValueError as e:
        raise TTSError(f"{flag} {path}: not JSON ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("levels"), list) or not report["levels"]:
        raise TTSError(f"{flag} {path}: no levels (expected the JSON that `ttsengine {flag[2:]}` writes)")
    return report


def bench_points(report: dict, flag: str = "--bench") -> tuple[Point, ...]:
    try:
        points = [Point(int(lv["concurrency"]), float(lv["realtime_x_min"]), lv.get("ttfa_p95_ms"))
                  for lv in report["levels"]]
    except (KeyError, TypeError, ValueError) as e:
        raise TTSError(f"{flag}: a level lacks concurrency or realtime_x_min ({e})") from None
    return tuple(sorted(points, key=_by_load))


def loadtest_points(report: dict, flag: str = "--loadtest") -> tuple[tuple[Point, ...], tuple[str, ...]]:
    """The first format's levels. A level with errors counts as below real time (its callers got none); the
    slowest stream is 1 / rtf_max, or 1 / rtf_p95 in files from before loadtest reported rtf_max (said in notes)."""
    fmt = report["levels"][0].get("format")
    points, notes = [], []
    try:
        for lv in (lv for lv in report["levels"] if lv.get("format") == fmt):
            rtf = lv.get("rtf_max")
            if rtf is None or not math.isfinite(rtf):
                rtf = lv["rtf_p95"]
                notes.append(f"loadtest level {lv['concurrency']}: no rtf_max in the file, read the p95 stream")
            x = 0.0 if lv.get("errors") or not rtf else 1.0 / rtf
            points.append(Point(int(lv["concurrency"]), x, lv.get("first_audio_p95_ms")))
    except (KeyError, TypeError, ValueError) as e:
        raise TTSError(f"{flag}: a level lacks concurrency or rtf_p95 ({e})") from None
    return tuple(sorted(points, key=_by_load)), tuple(notes)


def _by_load(p: Point) -> int:
    return p.concurrency


def held(points: tuple[Point, ...]) -> int:
    """The highest level with every stream at REALTIME_MARGIN x real time (0: none)."""
    return max((p.concurrency for p in points if p.realtime_x >= REALTIME_MARGIN), default=0)


def preset_named(name: str) -> Preset:
    try:
        return by_name(name.lower())
    except ConfigError as e:
        raise TTSError(str(e).replace("TTS_MEMORY_PRESET", "--gpu")) from None


def capacity(gpu: str | None, bench: Path | None, loadtest: Path | None) -> Capacity:
    """Measured when a file is given (both: the curve a caller sees, loadtest's, and the lower of the two
    capacities), else the preset's slots."""
    if bench is None and loadtest is None:
        if gpu is None:
            raise TTSError("give --gpu (a memory preset, e.g. h200), --bench JSON or --loadtest JSON")
        preset = preset_named(gpu)
        return Capacity(preset, preset.max_batch, "preset")
    sources, holds, curve, notes, ready = [], [], (), [], None
    name = gpu
    if bench is not None:
        report = read_json(bench, "--bench")
        curve = bench_points(report)
        holds.append(held(curve))
        sources.append("bench")
        name = name or (report.get("memory_preset") or {}).get("name")
        if report.get("load_s") is not None and report.get("warmup_s") is not None:
            ready = float(report["load_s"]) + float(report["warmup_s"])
    if loadtest is not None:
        curve, lt_notes = loadtest_points(read_json(loadtest, "--loadtest"))
        holds.append(held(curve))
        sources.append("loadtest")
        notes += lt_notes
    if name is None:
        raise TTSError("--gpu: name the GPU's memory preset (a loadtest JSON does not say which GPU served it)")
    streams = min(holds)
    if streams == 0:
        raise TTSError(f"no measured level kept every stream at {REALTIME_MARGIN:g}x real time: measure lower "
                       "concurrency levels")
    return Capacity(preset_named(name), streams, f"measured ({', '.join(sources)})", curve, ready, tuple(notes))


# ---- the curve between and beyond the measured levels --------------------------------------------------------------
def realtime_x(curve: tuple[Point, ...], load: float) -> float:
    """The slowest stream's real-time factor at `load` streams per instance: linear between levels; below the
    first, the first's; above the last, the last level's throughput shared by more streams (the GPU is full)."""
    return _read(curve, load, lambda p: p.realtime_x, lambda p, load: p.realtime_x * p.concurrency / load)


def first_audio_ms(curve: tuple[Point, ...], load: float) -> float | None:
    """First-audio p95 at `load` streams per instance; above the last level it grows with the load (the same
    prefill work shared by more requests). None without a measured curve."""
    if not curve or any(p.first_audio_p95_ms is None for p in curve):
        return None
    ms = lambda p: p.first_audio_p95_ms  # noqa: E731
    return _read(curve, load, ms, lambda p, load: ms(p) * load / p.concurrency)


def _read(curve, load, value, beyond) -> float:
    if load <= curve[0].concurrency:
        return value(curve[0])
    if load >= curve[-1].concurrency:
        return beyond(curve[-1], load)
    hi = next(i for i, p in enumerate(curve) if p.concurrency >= load)
    a, b = curve[hi - 1], curve[hi]
    return value(a) + (load - a.concurrency) / (b.concurrency - a.concurrency) * (value(b) - value(a))
