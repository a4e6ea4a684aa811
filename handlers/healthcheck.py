"""The image's HEALTHCHECK: `python -m handlers.healthcheck`. Which check depends on the mode PID 1 runs
(`http`: GET /health, `serve`: GET /ping, `runpod`: the worker process is alive; RunPod has no port)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path


def mode(cmdline: bytes) -> str:
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    for name in ("serve", "runpod", "http"):
        if name in args:
            return name
    return "http"


def main(port: int = 8080) -> int:
    try:
        which = mode(Path("/proc/1/cmdline").read_bytes())
    except OSError:
        which = "http"
    if which == "runpod":
        return 0  # PID 1 exists (we are running in its namespace): the worker loop is up
    path = "/ping" if which == "serve" else "/health"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=4) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"healthcheck: {path}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
