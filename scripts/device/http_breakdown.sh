#!/usr/bin/env bash
# Issue 43's breakdown, one device call: `bench` in-process and `python -m handlers http` at the same
# concurrency on one GPU (real S1-mini shapes, random weights). Writes a random real-size checkpoint (as soak.sh),
# runs bench --frames $FRAMES at $LEVELS, then starts the server (TTS_MAX_BATCH=256, TTS_TRACE_CHUNKS=on: per-chunk
# stages and per-thread CPU in /metrics), waits for /ready, runs one warm-up pass, then loadtest at $LEVELS (pcm,
# --max-new-tokens $FRAMES) with 1 and $PROCS client processes, and mp3/opus at the largest level. Each loadtest
# level reads the server's /metrics before and after (queue wait, engine first audio, first byte sent, chunk
# stages, engine loop and host seconds, CPU seconds per server thread). Prints a short table last.
# MODES: the server once per TTS_ENGINE_PROCESS value, in one call (e.g. MODES="off on": the before/after of the
# engine's own process); P1=0 skips the single-process load generator run.
# Usage: scripts/device/http_breakdown.sh   (env: CKPT, CACHE, LEVELS=64,256, FRAMES=192, PROCS=4, EXTRA=mp3,opus,
#        MODES=auto, P1=1)
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/http-breakdown}" 20000  # everything in $W; the few files worth keeping go to $OUT
CKPT=${CKPT:-/tmp/s1-random} CACHE=${CACHE:-/tmp/tts-cache} PORT=${PORT:-8080}
LEVELS=${LEVELS:-64,256} FRAMES=${FRAMES:-192} PROCS=${PROCS:-4} EXTRA=${EXTRA-mp3,opus} MODES=${MODES:-auto} P1=${P1:-1}
TOP=${LEVELS##*,}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, uvicorn, httptools, uvloop; print('torch', torch.__version__, 'uvicorn', uvicorn.__version__)"
nproc
random_checkpoint "$CKPT" "$W/write.log" || exit 1
t=$(date +%s)
TTS_CACHE_DIR=$CACHE timeout 300 python3 -m ttsengine bench --random-weights s1-mini --frames "$FRAMES" \
  --concurrency "$LEVELS" --check-audio 0 --out "$W/bench" > "$W/bench.log" 2>&1 \
  || { echo "bench failed"; tail -20 "$W/bench.log"; }
echo "bench took $(( $(date +%s) - t )) s"
URL=http://127.0.0.1:$PORT
lt() { local name=$1 t0; t0=$(date +%s); shift; timeout 240 python3 -m ttsengine loadtest "$URL" \
  --max-new-tokens "$FRAMES" --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "$name exit $? ($(( $(date +%s) - t0 )) s)"; }
RUNS=()
for mode in $MODES; do
  t=$(date +%s)
  TTS_MODEL_DIR=$CKPT TTS_CACHE_DIR=$CACHE TTS_DATA_DIR=/tmp/tts-data TTS_PORT=$PORT TTS_LOG_LEVEL=WARNING \
    TTS_MAX_BATCH=256 TTS_TRACE_CHUNKS=on TTS_ENGINE_PROCESS=$mode python3 -m handlers http > "$W/server-$mode.log" 2>&1 &
  PID=$!
  python3 scripts/device/wait_ready.py "$PORT" "$PID" 300 kernel_cache max_streams \
    || { tail -30 "$W/server-$mode.log"; kill $PID; exit 1; }
  echo "engine process $mode: ready after $(( $(date +%s) - t )) s"
  lt "warmup-$mode" --concurrency "$TOP" --requests "$TOP"
  [ "$P1" = 1 ] && { lt "pcm-p1-$mode" --concurrency "$LEVELS"; RUNS+=("pcm-p1-$mode"); }
  lt "pcm-p$PROCS-$mode" --concurrency "$LEVELS" --processes "$PROCS"; RUNS+=("pcm-p$PROCS-$mode")
  [ -n "$EXTRA" ] && { lt "extra-$mode" --concurrency "$TOP" --processes "$PROCS" --format "$EXTRA"; RUNS+=("extra-$mode"); }
  kill -TERM $PID; wait $PID
  echo "server exit $?: $(grep -c Traceback "$W/server-$mode.log") tracebacks"
done
cp "$W/bench/bench.json" "$OUT/bench.json"
for n in "${RUNS[@]}"; do [ -f "$W/$n/loadtest.json" ] && cp "$W/$n/loadtest.json" "$OUT/lt-$n.json"; done
python3 scripts/device/http_breakdown_table.py "$W" "${RUNS[@]}" | tee "$OUT/table.txt"
