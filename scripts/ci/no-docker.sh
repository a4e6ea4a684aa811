#!/usr/bin/env bash
# The README's path without Docker, as a new user runs it on a CPU machine (CI): scripts/dev-setup.sh makes .venv
# (the smoke synthesis included), then `. .venv/bin/activate && python -m handlers http` with the tiny test
# checkpoint serves /ready and a speech request. The torch it installs is the lane's (TORCH_SPEC), from pip's cache
# or this machine's wheel: PyTorch's CPU index (--cpu) is not reachable from CI.
# Usage: scripts/ci/no-docker.sh TORCH_SPEC   (run in a clone; leaves .venv there)
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEC=${1:?torch requirement, e.g. torch==2.13.0}
TORCH_SPEC=$SPEC bash scripts/dev-setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# a free port (a fixed one could be taken, and the check would then talk to whatever holds it)
PORT=${PORT:-$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
LOG=$(mktemp)
TTS_MODEL_DIR=tests/assets/golden/checkpoint TTS_PORT=$PORT TTS_DATA_DIR=$(mktemp -d) python -m handlers http \
  >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
python - "$PORT" "$PID" <<'PY' || { echo "no-docker: the server failed; its log:" >&2; tail -30 "$LOG" >&2; exit 1; }
import io, os, sys, time, wave
import httpx
port, pid = sys.argv[1], int(sys.argv[2])
url, end = f"http://127.0.0.1:{port}", time.time() + 180
def running(pid: int) -> bool:
    """Alive and not a zombie (a server that exited stays in the process table until the shell reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


while True:
    if not running(pid):
        sys.exit("the server exited before it was ready")
    try:
        if httpx.get(url + "/ready", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.time() > end:
        sys.exit("not ready after 180 s")
    time.sleep(0.5)
r = httpx.post(url + "/v1/audio/speech", json={"input": "Hello there.", "response_format": "wav",
                                               "max_new_tokens": 20, "seed": 1, "stream": False}, timeout=120)
assert r.status_code == 200, r.text
with wave.open(io.BytesIO(r.content)) as w:
    frames, rate = w.getnframes(), w.getframerate()
assert frames == 19 * 2048, frames
print(f"no-docker: python -m handlers http from .venv served {frames / rate:.2f} s of speech")
PY
