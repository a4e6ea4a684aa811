#!/usr/bin/env bash
# The README's path without Docker, as a new user runs it on a CPU machine (CI), its commands taken verbatim from the
# README's "Without Docker" block: the set-up line (scripts/dev-setup.sh makes .venv, smoke synthesis included, and
# activates it), then the no-token line (TTS_MODEL_SOURCE=tiny: the tiny model fetched into models/tiny, served by
# `python -m handlers http`). Checked: /ready names the tiny model, the README's first curl request (no
# max_new_tokens) answers mp3, a wav request has the frames it asked for. The torch it installs is the lane's
# (TORCH_SPEC), from pip's cache or this machine's wheel: PyTorch's CPU index (--cpu) is not reachable from CI.
# Usage: scripts/ci/no-docker.sh TORCH_SPEC   (run in a clone; leaves .venv and models/tiny there)
set -euo pipefail
cd "$(dirname "$0")/../.."
export TORCH_SPEC=${1:?torch requirement, e.g. torch==2.13.0}
# the README's block: the first bash block after "Without Docker", its set-up line and its no-token line
block=$(awk '/^Without Docker/{f=1} f && /^```bash/{g=1; next} g && /^```/{exit} g' README.md)
setup_line=$(grep -m1 'scripts/dev-setup.sh' <<<"$block" || true)
serve_line=$(grep -m1 'no token needed' <<<"$block" || true)
[ -n "$setup_line" ] && [ -n "$serve_line" ] ||
  { echo "no-docker: README.md's 'Without Docker' block lost its set-up or its no-token line:" >&2; echo "$block" >&2; exit 1; }
echo "no-docker: README: $setup_line"
eval "$setup_line"  # activates .venv in this shell, as it does in the user's
# a free port (a fixed one could be taken, and the check would then talk to whatever holds it)
export TTS_PORT=${PORT:-$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
TTS_DATA_DIR=$(mktemp -d)
export TTS_DATA_DIR
LOG=$(mktemp)
rm -rf models/tiny  # a fresh clone has none; a rerun in the same clone fetches it again
echo "no-docker: README: $serve_line   (TTS_PORT=$TTS_PORT)"
bash -c "$serve_line" >"$LOG" 2>&1 &  # one simple command: bash execs it, so $! is the server (eval in a
PID=$!                                 # background subshell left the server running past the trap's kill)
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
python - "$TTS_PORT" "$PID" <<'PY' || { echo "no-docker: the server failed; its log:" >&2; tail -30 "$LOG" >&2; exit 1; }
import io, sys, time, wave
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
model = httpx.get(url + "/ready", timeout=5).json()["model"]
assert model["source"] == "tiny" and model["dir"] == "models/tiny", model
# the README's first curl: no max_new_tokens, so the tiny model's short default length, not 1024 frames of noise
t0 = time.time()
r = httpx.post(url + "/v1/audio/speech", json={"input": "Hello there.", "response_format": "mp3"}, timeout=120)
assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg" and len(r.content) > 1000, (r, r.text[:200])
took, mp3 = time.time() - t0, len(r.content)
r = httpx.post(url + "/v1/audio/speech", json={"input": "Hello there.", "response_format": "wav",
                                               "max_new_tokens": 20, "seed": 1, "stream": False}, timeout=120)
assert r.status_code == 200, r.text
with wave.open(io.BytesIO(r.content)) as w:
    frames, rate = w.getnframes(), w.getframerate()
assert frames == 19 * 2048, frames
print(f"no-docker: the README's commands served {model['source']} from {model['dir']}: the first curl's mp3 "
      f"({mp3} B in {took:.1f} s), a wav of {frames / rate:.2f} s for 20 frames")
PY
