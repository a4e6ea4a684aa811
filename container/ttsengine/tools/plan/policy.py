"""A platform's autoscaler as the simulation runs it: a target of streams per instance (desired instances =
ceil(streams wanted / target)), how soon it may act again, how far it may move at once, and how long the load
must stay low before it scales in."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    platform: str
    target: float  # streams per instance the scaler aims at
    settings: dict  # what to write into the platform's configuration
    out_cooldown_s: float = 0.0  # after a scale-out, the next one waits this long
    in_cooldown_s: float = 0.0  # after a scale-in, the next one waits this long
    in_window_s: float = 60.0  # scale in to the highest desired count of this window (alarm or stabilization)
    out_step: int = 0  # instances added per scale-out at most (0: as many as wanted)
    in_step: int = 0  # instances removed per scale-in at most (0: as many as wanted)
    min_instances: int = 1
    source: str = ""  # where the numbers come from

    def desired(self, streams: float) -> int:
        return max(self.min_instances, math.ceil(streams / self.target - 1e-9))
