#!/usr/bin/env bash
# Issue 43, one device call, one GPU: the HTTP front's event loop under $C pcm streams (real S1-mini shapes, random
# weights, TTS_MAX_BATCH=$C, a fresh cache directory). The server runs under front_profile.py; after a warm-up
# load, py-spy (when .whl carries it; --threads, raw stacks) samples the whole front process during one steady
# load, then cProfile during another (Python 3.12's cProfile sees every thread: read py-spy's per-thread view for the
# loop). Prints the py-spy main-thread leaves and cProfile's top.
# Usage: scripts/device/front_profile.sh   (env: C=256, FRAMES=192, PROCS=4, FORMAT=pcm, CKPT, CACHE)
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/front-profile}" 8000
C=${C:-256} FRAMES=${FRAMES:-192} PROCS=${PROCS:-4} FORMAT=${FORMAT:-pcm} CKPT=${CKPT:-/tmp/s1-random}
CACHE=${CACHE:-/tmp/front-profile-cache} PORT=8080 URL=http://127.0.0.1:8080
random_checkpoint "$CKPT" "$W/write.log" || exit 1
PROFILE_OUT=$OUT/front.prof TTS_MODEL_DIR="$CKPT" TTS_CACHE_DIR="$CACHE" TTS_PORT=$PORT TTS_LOG_LEVEL=WARNING \
  TTS_MAX_BATCH=$C python3 scripts/device/front_profile.py > "$W/server-front.log" 2>&1 &
PID=$!
python3 scripts/device/wait_ready.py "$PORT" "$PID" 240 kernel_cache || { tail -30 "$W/server-front.log"; exit 1; }
lt() { timeout 120 python3 -m ttsengine loadtest "$URL" --max-new-tokens "$FRAMES" --processes "$PROCS" \
  --concurrency "$C" --format "$FORMAT" --out "$W/$1" > "$W/$1.log" 2>&1; echo "loadtest $1 exit $?"
  grep -E "first audio|audio-s/s|rtf" "$W/$1.log" | head -4; }
lt warmup
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
if [ -x "$SPY" ]; then
  "$SPY" record -p "$PID" -d 10 -r 250 --threads --nonblocking -f raw -o "$OUT/spy.txt" > "$W/spy.log" 2>&1 &
  SP=$!
fi
lt spied; [ -n "${SP:-}" ] && { wait "$SP"; tail -3 "$W/spy.log"; }
kill -USR1 "$PID"; lt profiled; kill -USR2 "$PID"; sleep 3
server_down "$PID" front
[ -f "$OUT/spy.txt" ] && python3 scripts/device/spy_leaves.py "$OUT/spy.txt"
[ -f "$OUT/front.prof.txt" ] && sed -n 1,70p "$OUT/front.prof.txt"
