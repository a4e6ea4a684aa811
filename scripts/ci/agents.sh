#!/usr/bin/env bash
# The voice-agent framework plugins against the real server (CI, CPU; issue 45): docs/voice-agents.md's LiveKit
# Agents and Pipecat snippets, run as written there by scripts/voice_agent_snippets.py, so a framework release or a
# change of ours that breaks what the page tells users to paste fails CI instead of a user's agent.
#   1. the frameworks' venv: CACHE_DIR/agents-venv-<hash of scripts/ci/agents-requirements.txt and the Python
#      version>, made once (pip's cache is whatever PIP_CACHE_DIR says) and reused; an older one is removed;
#   2. the project's server from PYTHON's venv (`python -m handlers http`) on the tiny test checkpoint on CPU, a free
#      port, a temporary TTS_DATA_DIR and 48 frames per segment by default (as the page's figures), until /ready;
#   3. the voice `alice` the Fish snippets name: POST /v1/references/add with 1 s of seeded noise (a WAV made here:
#      tests/assets has none) and a transcript;
#   4. scripts/voice_agent_snippets.py URL livekit, then pipecat, with the frameworks' Python: every service the
#      snippets make (fish_tts, eleven_tts, openai_tts) must return audio, without an error; then /metrics must have
#      counted each framework's Fish and ElevenLabs sessions (the live sockets, not another route).
# Prints each service's audio seconds. Fails with one line saying what, after the log tail. The server is always
# stopped. Not run: a LiveKit room or AgentSession and a Pipecat transport (they need a LiveKit server, a WebRTC peer,
# an STT and an LLM).
# Usage: scripts/ci/agents.sh PROJECT_PYTHON CACHE_DIR   (PROJECT_PYTHON: the project's venv's python; CACHE_DIR:
#        where the frameworks' venv is kept; env PYTHON: the interpreter that venv is made with, default python3.11)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY=${1:?usage: agents.sh PROJECT_PYTHON CACHE_DIR} CACHE=${2:?usage: agents.sh PROJECT_PYTHON CACHE_DIR}
REQS=scripts/ci/agents-requirements.txt
SERVICES="fish_tts eleven_tts openai_tts"  # the *_tts names both snippets define
START=$(date +%s)
say() { echo "agents: $* ($(( $(date +%s) - START )) s)"; }
join() { local IFS=$'\x1f' s; s="$*"; echo "${s//$'\x1f'/, }"; }  # the arguments as "a, b, c"
FAILED=""
fail() {  # the logs' tails, then one line saying what, last
  [ ! -s "${TMP:-}/server.log" ] || { echo "agents: the server's log (tail):" >&2; tail -20 "$TMP/server.log" >&2; }
  FAILED=1; echo "agents: FAILED: $*" >&2; exit 1
}

# ---- 1. the frameworks' venv, cached on its pins ----------------------------------------------------------------
BASE_PY=${PYTHON:-python3.11}
command -v "$BASE_PY" >/dev/null || BASE_PY=python3
key=$( (cat "$REQS"; "$BASE_PY" --version) | sha256sum | cut -c1-16)
AVENV=$CACHE/agents-venv-$key
if [ ! -f "$AVENV/.complete" ]; then
  say "creating $AVENV from $REQS"
  mkdir -p "$CACHE"
  rm -rf "$CACHE"/agents-venv-*  # an older key's venv (about 750 MB each)
  "$BASE_PY" -m venv "$AVENV"
  "$AVENV/bin/pip" install -q --upgrade pip
  "$AVENV/bin/pip" install -q -r "$REQS"
  touch "$AVENV/.complete"
else
  say "reusing $AVENV"
fi
"$AVENV/bin/python" -c "from importlib.metadata import version as v; print('agents:', *(p + ' ' + v(p) for p in \
('livekit-agents', 'livekit-plugins-fishaudio', 'livekit-plugins-elevenlabs', 'livekit-plugins-openai', 'pipecat-ai')))"

# ---- 2. the server, always stopped ------------------------------------------------------------------------------
TMP=$(mktemp -d)
PID=""
cleanup() {
  local rc=$?
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  [ $rc = 0 ] || [ -n "$FAILED" ] || echo "agents: FAILED: exit $rc before the snippets' checks (output above)" >&2
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL=http://127.0.0.1:$PORT
# PYTHONPATH: this checkout's code even when PYTHON's venv has the project installed from another one
env PYTHONPATH="$ROOT/container:$ROOT${PYTHONPATH:+:$PYTHONPATH}" TTS_MODEL_DIR="$ROOT/tests/assets/golden/checkpoint" \
  TTS_DEVICE=cpu TTS_HOST=127.0.0.1 TTS_PORT="$PORT" TTS_DATA_DIR="$TMP/data" TTS_DEFAULT_MAX_NEW_TOKENS=48 \
  TTS_LOG_LEVEL=WARNING TTS_DRAIN_SECONDS=2 "$PY" -m handlers http >"$TMP/server.log" 2>&1 &
PID=$!
say "server: python -m handlers http on $URL (tiny checkpoint, cpu)"

# ---- 3. ready, and the voice alice ------------------------------------------------------------------------------
"$PY" - "$URL" "$PID" <<'PY' || fail "the server did not become ready or refused the voice alice"
import io, random, struct, sys, time, wave
import httpx
url, pid = sys.argv[1], int(sys.argv[2])
end = time.time() + 180
def running() -> bool:
    try:  # alive and not a zombie
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
while True:
    if not running():
        sys.exit("the server exited before it was ready")
    try:
        if httpx.get(url + "/ready", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.time() > end:
        sys.exit("not ready after 180 s")
    time.sleep(0.3)
rng, buf = random.Random(0), io.BytesIO()
with wave.open(buf, "wb") as w:  # 1 s of noise at 22.05 kHz, as the tests' references
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(22050)
    w.writeframes(b"".join(struct.pack("<h", max(-32767, min(32767, int(rng.gauss(0, 6500))))) for _ in range(22050)))
r = httpx.post(url + "/v1/references/add", data={"id": "alice", "text": "hello alice"},
               files={"audio": ("alice.wav", buf.getvalue(), "audio/wav")}, timeout=60)
if r.status_code != 201:
    sys.exit(f"POST /v1/references/add: {r.status_code} {r.text[:200]}")
print(f"agents: ready; voice alice stored ({r.json()['seconds']} s)")
PY

# ---- 4. the snippets, per framework -----------------------------------------------------------------------------
SUMMARY=()
run_framework() {
  local fw=$1 log=$TMP/$1.log rc=0 t0 line secs bad=()
  t0=$(date +%s)
  timeout 300 "$AVENV/bin/python" scripts/voice_agent_snippets.py "$URL" "$fw" >"$log" 2>&1 || rc=$?
  grep -E "^$fw [a-z_]+: " "$log" | sed 's/^/agents: /' || true
  for s in $SERVICES; do
    line=$(grep -E "^$fw $s: " "$log" || true)
    secs=${line#*: }; secs=${secs%% s *}
    if [ -z "$line" ]; then bad+=("$s (no result)")
    elif ! awk -v s="$secs" 'BEGIN { exit !(s > 0) }'; then bad+=("$s (${secs} s)")
    elif [[ ! $line =~ Hz$ ]]; then bad+=("$s (an error: ${line#* Hz })")
    else SUMMARY+=("$fw $s ${secs} s")
    fi
  done
  if [ $rc != 0 ] || [ ${#bad[@]} != 0 ]; then
    echo "agents: scripts/voice_agent_snippets.py $fw's log (tail):" >&2
    tail -25 "$log" >&2
    [ $rc != 124 ] || fail "$fw: scripts/voice_agent_snippets.py timed out after 300 s"
    [ ${#bad[@]} != 0 ] || fail "$fw: scripts/voice_agent_snippets.py exited $rc, though every service reported audio"
    fail "$fw: no audio from $(join "${bad[@]}") (scripts/voice_agent_snippets.py exited $rc)"
  fi
  say "$fw: every service spoke in $(( $(date +%s) - t0 )) s"
}
run_framework livekit
run_framework pipecat

# the Fish and ElevenLabs services went through the live sockets: two sessions of each (one per framework)
"$PY" - "$URL" <<'PY' || fail "/metrics did not count the frameworks' live sessions"
import re, sys
import httpx
text = httpx.get(sys.argv[1] + "/metrics", timeout=10).text
n = {p: float(m.group(1)) if (m := re.search(rf'^tts_live_sessions_total{{protocol="{p}"}} (\S+)$', text, re.M)) else 0
     for p in ("fish", "elevenlabs")}
print(f"agents: /metrics: live sessions fish {n['fish']:g}, elevenlabs {n['elevenlabs']:g}")
sys.exit(0 if min(n.values()) >= 2 else "expected at least 2 of each")
PY
say "done: audio seconds: $(join "${SUMMARY[@]}")"
