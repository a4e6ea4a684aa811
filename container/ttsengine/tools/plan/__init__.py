"""`python -m ttsengine plan`: how many instances of one GPU type a traffic needs, the autoscaling settings of
each platform, the cost, and a simulated day.

Capacity per instance: the highest measured level (--bench / --loadtest JSON) with every stream at 1.2x real
time or faster, else the GPU's memory preset (--gpu). Traffic: --peak concurrent streams with --curve (hourly
fractions of the peak) or --trace (CSV time,concurrent_streams), --burst for the top of each hour. Prints a
summary and per-hour table per platform; writes plan.json and plan.html (--out).
"""

from .command import main

__all__ = ["main"]
