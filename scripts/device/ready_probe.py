"""Polls a server's /ready every 20 ms until it answers 200 (issue 44: a burst goes out the moment it does), then
writes {"ready_after_s", "ready"} (seconds since STARTED, the /ready JSON at that moment) to OUT_JSON and exits 0.
With --settled it instead waits until /ready says no graph is pending (graphs_pending false) and writes the same.
Usage: python3 scripts/device/ready_probe.py PORT PID STARTED_EPOCH TIMEOUT_S OUT_JSON [--settled]"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

port, pid, started, limit, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
settled = "--settled" in sys.argv[6:]
t0 = time.time()
last = None
while time.time() - t0 < limit:
    try:
        r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5))
        last = r
        if not settled or not r.get("graphs_pending"):
            with open(out, "w") as f:
                json.dump({"ready_after_s": time.time() - started, "ready": r}, f, indent=1)
            print(f"{'settled' if settled else 'ready'} after {time.time() - started:.1f} s "
                  f"(admit_streams {r.get('admit_streams')}, graphs_pending {r.get('graphs_pending')})")
            sys.exit(0)
    except (urllib.error.URLError, OSError, ValueError):  # not up yet: refused, 503 while loading
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"the server (pid {pid}) exited before /ready said 200")
    time.sleep(0.02 if not settled else 0.5)
if last is not None:  # settled: report how far it got
    with open(out, "w") as f:
        json.dump({"ready_after_s": None, "ready": last}, f, indent=1)
sys.exit(f"not {'settled' if settled else 'ready'} after {limit:g} s")
