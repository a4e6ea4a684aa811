"""Where a profiled run's GPU time went, stream by stream: how long each CUDA stream had a kernel running, how
long any did, and how long two or more did at once (the engine's decode steps and the codec share the GPU on two
streams: whether they overlap or take turns decides the throughput; bench --profile prints it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamTime:
    stream: Hashable  # the stream's label (bench: "cuda:0 stream 7")
    kernels: int
    kernel_us: float  # the kernels' own durations summed (overlapping kernels counted each)
    busy_us: float  # time with at least one of the stream's kernels running


@dataclass(frozen=True)
class Timeline:
    span_us: float  # first kernel start to last kernel end
    busy_us: float  # time with any kernel running
    shared_us: float  # time with kernels of two or more streams running
    streams: tuple[StreamTime, ...]  # busiest first


def covered(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) spans as disjoint spans in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def timeline(kernels: Iterable[tuple[float, float, Hashable]]) -> Timeline:
    """kernels: (start_us, end_us, stream label) of every GPU kernel -> the per-stream and shared busy time."""
    by_stream: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
    for start, end, stream in kernels:
        by_stream[stream].append((start, end))
    if not by_stream:
        return Timeline(0.0, 0.0, 0.0, ())
    unions = {s: covered(spans) for s, spans in by_stream.items()}
    # time with >= 2 streams busy: sweep the streams' own unions (each stream counts once however many kernels)
    edges = sorted((t, d) for spans in unions.values() for a, b in spans for t, d in ((a, 1), (b, -1)))
    shared, depth, last = 0.0, 0, 0.0
    for t, d in edges:
        if depth >= 2:
            shared += t - last
        depth, last = depth + d, t
    everything = covered(s for spans in unions.values() for s in spans)
    streams = sorted((StreamTime(s, len(spans), sum(b - a for a, b in spans), _length(unions[s]))
                      for s, spans in by_stream.items()), key=lambda st: -st.busy_us)
    return Timeline(everything[-1][1] - everything[0][0], _length(everything), shared, tuple(streams))
