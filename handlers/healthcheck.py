"""The image's HEALTHCHECK: `python -m handlers.healthcheck`. Which check depends on the mode PID 1 runs
(`http`: GET /health, `serve`: GET /ping, `runpod`: the worker process is alive; RunPod has no port)."""

from __future__ import annotations

import os
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


def port_for(which: str, env=os.environ) -> int:
    """The port the server of `which` listens on, as its adapter reads it (serve: SageMaker's
    SAGEMAKER_BIND_TO_PORT, then TTS_PORT; http: TTS_PORT; both 8080 by default). Read here without importing
    the engine: the check must answer within its 5 s timeout."""
    names = ("SAGEMAKER_BIND_TO_PORT", "TTS_PORT") if which == "serve" else ("TTS_PORT",)
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 8080


def main(port: int | None = None) -> int:
    try:
        which = mode(Path("/proc/1/cmdline").read_bytes())
    except OSError:
        which = "http"
    if which == "runpod":
        return 0  # PID 1 exists (we are running in its namespace): the worker loop is up
    port = port_for(which) if port is None else port
    path = "/ping" if which == "serve" else "/health"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=4) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"healthcheck: {path}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
