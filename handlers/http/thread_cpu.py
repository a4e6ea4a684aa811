"""CPU seconds per thread of this process, from /proc/self/task (Linux; empty elsewhere), summed by role: the
Python thread's name without its trailing number ("asyncio_3" -> "asyncio"), "other" for threads Python did not
start (torch's, the CUDA driver's). Threads that have ended are no longer counted."""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict

_NUMBER = re.compile(r"[-_ ]?[\d_-]+$")


def role(name: str) -> str:
    return _NUMBER.sub("", name) or name


def thread_cpu() -> dict[str, float]:
    names = {t.native_id: role(t.name) for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        out[names.get(int(tid), "other")] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return dict(out)
