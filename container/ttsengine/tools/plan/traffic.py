"""The streams callers want, one value a minute: a curve of hourly fractions of the peak, or a CSV trace of
`time,concurrent_streams`; a burst factor raises the first minutes of each hour (calls bunch at the top of
the hour) and the peak the instances are sized for."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ...errors import TTSError


@dataclass(frozen=True)
class Traffic:
    minutes: tuple[float, ...]  # concurrent streams wanted in each minute
    peak: float  # the curve's peak before bursts
    burst: float  # multiplies the first burst_minutes of each hour
    burst_minutes: int
    source: str

    @property
    def sized_peak(self) -> float:
        """What the instances for peak are sized for: the peak with its burst."""
        return self.peak * self.burst


def _check_burst(burst: float, burst_minutes: int) -> None:
    if not burst >= 1:
        raise TTSError(f"--burst {burst:g}: give a factor >= 1")
    if not 0 <= burst_minutes <= 60:
        raise TTSError(f"--burst-minutes {burst_minutes}: give 0 to 60")


def _bursts(values: list[float], burst: float, burst_minutes: int) -> tuple[float, ...]:
    return tuple(v * burst if m % 60 < burst_minutes else v for m, v in enumerate(values))


def from_curve(text: str, peak: float, burst: float = 1.0, burst_minutes: int = 5) -> Traffic:
    """`text`: comma-separated fractions of `peak`, one per hour (24 for a day); each hour's minutes hold its
    value (a step curve)."""
    _check_burst(burst, burst_minutes)
    if not peak > 0:
        raise TTSError(f"--peak {peak:g}: give the peak concurrent streams (> 0)")
    try:
        fractions = [float(x) for x in text.split(",")]
    except ValueError:
        raise TTSError(f"--curve {text!r}: give comma-separated fractions of the peak, one per hour") from None
    if not fractions or any(not 0 <= f <= 1 for f in fractions):
        raise TTSError(f"--curve {text!r}: each hour's fraction of the peak must be in [0, 1]")
    values = [peak * f for f in fractions for _ in range(60)]
    return Traffic(_bursts(values, burst, burst_minutes), peak * max(fractions), burst, burst_minutes,
                   f"{len(fractions)} hourly fractions of {peak:g} streams")


def _seconds(text: str) -> float:
    """Seconds from the trace's start: a number of seconds, or HH:MM[:SS]."""
    if ":" in text:
        parts = [float(p) for p in text.split(":")]
        if len(parts) > 3:
            raise ValueError(text)
        return sum(p * 60 ** (2 - i) for i, p in enumerate(parts + [0.0] * (3 - len(parts))))
    return float(text)


def from_trace(path: Path, peak: float | None = None, burst: float = 1.0, burst_minutes: int = 0) -> Traffic:
    """A CSV of `time,concurrent_streams` (a header row is skipped). Each minute takes the highest sample in it,
    or the last value before it; `peak` scales the trace to that maximum."""
    _check_burst(burst, burst_minutes)
    try:
        rows = list(csv.reader(Path(path).read_text().splitlines()))
    except (OSError, UnicodeDecodeError) as e:
        raise TTSError(f"--trace {path}: {getattr(e, 'strerror', None) or e}") from None
    samples = []
    for n, row in enumerate(rows, 1):
        if not row or not "".join(row).strip():
            continue
        try:
            samples.append((_seconds(row[0].strip()), float(row[1])))
        except (ValueError, IndexError):
            if n == 1:
                continue  # a header
            raise TTSError(f"--trace {path}: line {n}: expected time,concurrent_streams, got {','.join(row)!r}") \
                from None
    if not samples:
        raise TTSError(f"--trace {path}: no time,concurrent_streams rows")
    if any(s < 0 or v < 0 for s, v in samples):
        raise TTSError(f"--trace {path}: times and streams must be >= 0")
    samples.sort()
    values, last, i = [], samples[0][1], 0
    for m in range(int(samples[-1][0] // 60) + 1):
        inside = []
        while i < len(samples) and samples[i][0] < (m + 1) * 60:
            inside.append(samples[i][1])
            i += 1
        values.append(max(inside) if inside else last)
        last = inside[-1] if inside else last
    top = max(values)
    if peak is not None:
        if not peak > 0 or top == 0:
            raise TTSError(f"--peak {peak:g}: give > 0 for a trace with traffic")
        values = [v * peak / top for v in values]
    return Traffic(_bursts(values, burst, burst_minutes), max(values), burst, burst_minutes,
                   f"trace {path} ({len(samples)} samples)")
