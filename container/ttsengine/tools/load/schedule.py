"""When a level's requests are sent: closed loop (each client sends its next request when the last one ended) or
open loop (`poisson:RATE`: requests at seeded exponential gaps, RATE per second, whatever is still running), and
how the requests are shared out among client processes."""

from __future__ import annotations

import random
from dataclasses import dataclass

START_S = 3.0  # client processes begin together this long after their shares are handed out (spawn and imports)


@dataclass(frozen=True)
class Share:
    """One client process's part of a level: closed loop, `clients` clients over `requests` requests; open loop,
    the requests `indices` sent at `offsets` seconds after the level's start."""

    clients: int
    requests: int
    indices: tuple[int, ...] = ()
    offsets: tuple[float, ...] | None = None  # None: closed loop


def poisson_rate(spec: str | None) -> float | None:
    """`closed` or None -> None; `poisson:RATE` -> RATE requests per second."""
    if spec in (None, "", "closed"):
        return None
    kind, _, value = spec.partition(":")
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if kind != "poisson" or not rate > 0:
        raise ValueError(f"--arrivals {spec!r}: expected closed or poisson:RATE with RATE > 0 requests per second")
    return rate


def arrival_offsets(n: int, rate: float, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of n requests is sent: exponential gaps, the first at 0."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def shares(clients: int, requests: int, processes: int, rate: float | None) -> list[Share]:
    """The level split over `processes` (fewer when there are fewer clients): closed loop, clients and requests
    as evenly as they go, the request numbers (seeds) kept apart; open loop, arrival i to process i mod N."""
    if rate is not None:
        offsets = arrival_offsets(requests, rate)
        n = max(1, min(processes, requests))
        return [Share(0, len(offsets[k::n]), tuple(range(k, requests, n)), tuple(offsets[k::n])) for k in range(n)]
    n = max(1, min(processes, clients))
    out, first = [], 0
    for k in range(n):
        c = clients // n + (k < clients % n)
        r = requests // n + (k < requests % n)
        out.append(Share(c, r, tuple(range(first, first + r))))
        first += r
    return out
