"""A day in minute steps: the platform's autoscaler follows the streams wanted, a new instance serves only after
its cold start, and each minute's callers get the first audio and speed the measured curve gives at the load
per serving instance.

Model (what a minute step can say): streams spread evenly over the serving instances; streams beyond their slots
are refused (a caller who waits minutes for a slot has hung up); callers arrive at streams x 60 / stream_s a
minute (Little's law); every instance started is billed from the decision, ready or not."""

from __future__ import annotations

from dataclasses import dataclass

from .capacity import Capacity, first_audio_ms, realtime_x
from .policy import Policy


@dataclass(frozen=True)
class Minute:
    wanted: float  # concurrent streams callers want
    billed: int  # instances running or starting
    ready: int  # instances serving
    served: float  # concurrent streams served
    arrivals: float  # requests this minute
    refused: float  # requests refused (no slot)
    below_realtime: float  # requests served slower than real time
    first_audio: tuple[tuple[float, float], ...]  # (first audio ms, requests): none without a measured curve


@dataclass(frozen=True)
class Hour:
    hour: int
    instances_mean: float  # billed
    instances_max: int
    wanted_max: float
    first_audio_p95_ms: float | None
    below_realtime: float  # requests
    refused: float  # requests
    stream_hours: float  # served
    instance_hours: float


def simulate(wanted: tuple[float, ...], cap: Capacity, policy: Policy, slots: int, ready_s: float,
             stream_s: float, first_burst_s: float = 0.0) -> list[Minute]:
    """`slots`: streams an instance admits; `ready_s`: from the scaler's decision to serving; `first_burst_s`: added
    to the first audio of the requests a new instance takes in its first minute (graphs captured at first use)."""
    ready = policy.desired(wanted[0])  # the day starts in steady state
    starting: list[float] = []  # when each starting instance will serve (seconds)
    last_out = last_in = float("-inf")
    history: list[int] = []
    window = max(1, round(policy.in_window_s / 60))
    out = []
    for m, want in enumerate(wanted):
        now = m * 60.0
        new = sum(t <= now for t in starting)
        starting = [t for t in starting if t > now]
        ready += new
        served = min(want, ready * slots)
        arrivals = want * 60.0 / stream_s
        admitted = arrivals * served / want if want else 0.0
        load = served / ready if ready else 0.0
        slow = cap.measured and served > 0 and realtime_x(cap.curve, load) < 1.0
        ms = first_audio_ms(cap.curve, load) if served > 0 else None
        groups = ()
        if ms is not None:
            fresh = admitted * new / ready if first_burst_s else 0.0  # even spread: new instances' share
            groups = tuple((v, w) for v, w in ((ms + 1000 * first_burst_s, fresh), (ms, admitted - fresh)) if w > 0)
        out.append(Minute(want, ready + len(starting), ready, served, arrivals, arrivals - admitted,
                          admitted if slow else 0.0, groups))
        # the scaler's decision at the minute's end
        desired = policy.desired(want)
        history = (history + [desired])[-window:]
        total, end = ready + len(starting), now + 60.0
        if desired > total and end - last_out >= policy.out_cooldown_s:
            add = desired - total if not policy.out_step else min(policy.out_step, desired - total)
            starting += [end + ready_s] * add
            last_out = end
        elif len(history) == window and max(history) < total and end - last_in >= policy.in_cooldown_s:
            drop = total - max(history) if not policy.in_step else min(policy.in_step, total - max(history))
            cut = min(drop, len(starting))  # starting instances go first: they serve nobody yet
            starting = sorted(starting)[:len(starting) - cut]
            ready -= drop - cut
            last_in = end
    return out


def weighted_p95(groups) -> float | None:
    """The smallest value with at least 95% of the weight at or below it."""
    groups = sorted(groups)
    total = sum(w for _, w in groups)
    if not total:
        return None
    seen = 0.0
    for value, w in groups:
        seen += w
        if seen >= 0.95 * total - 1e-9:
            return value
    return groups[-1][0]


def hours(minutes: list[Minute]) -> list[Hour]:
    out = []
    for h in range(0, len(minutes), 60):
        ms = minutes[h:h + 60]
        p95 = weighted_p95([g for m in ms for g in m.first_audio])
        out.append(Hour(h // 60, sum(m.billed for m in ms) / len(ms), max(m.billed for m in ms),
                        max(m.wanted for m in ms), p95, sum(m.below_realtime for m in ms),
                        sum(m.refused for m in ms), sum(m.served for m in ms) / 60, sum(m.billed for m in ms) / 60))
    return out
