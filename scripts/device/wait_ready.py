"""Waits for a server started in the background to answer /ready with 200, then prints how long it took and a few
of its fields. Usage: python3 scripts/device/wait_ready.py PORT PID TIMEOUT_S [FIELD ...]; exits non-zero with one
line if the process died or the time ran out (the device scripts then print the server's log)."""

import json
import os
import sys
import time
import urllib.request

port, pid, limit, fields = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]


def alive(pid: int) -> bool:
    """Running: not gone and not a zombie (a background child that died stays one until its shell waits for it)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


t0 = time.time()
while time.time() - t0 < limit:
    try:
        r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5))
        print(f"ready after {time.time() - t0:.1f} s:", {k: r.get(k) for k in fields})
        sys.exit(0)
    except Exception:  # noqa: BLE001 - not up yet: connection refused, 503 while loading
        if not alive(pid):
            sys.exit(f"the server (pid {pid}) exited before /ready said 200")
        time.sleep(1)
sys.exit(f"not ready after {limit:g} s")
