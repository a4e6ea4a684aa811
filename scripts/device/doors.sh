#!/usr/bin/env bash
# Issue 43's other doors, one device call, one GPU, real S1-mini shapes with random weights, TTS_MAX_BATCH=$MAX:
# the same load through each door the product has, one after another, each server fresh on the kernel cache the
# first filled (it starts from an empty one):
#   http:   `python -m handlers http`, loadtest (OpenAI's speech API, $PROCS client processes);
#   serve:  `python -m handlers serve` (SageMaker's container), loadtest --door serve (streamed /invocations, JSON
#           lines of base64 audio, $PROCS client processes);
#   runpod: `python -m handlers runpod` taking jobs from the job queue loadtest --door runpod hosts (RunPod's worker
#           loop with its concurrency modifier; one client process, which also runs the queue: its CPU is shown).
# Each door: one warm-up level at the largest concurrency, then $LEVELS (closed loop, pcm, $FRAMES frames).
# Prints the table last (first audio, delivered audio, slowest stream, stalls, loadgen CPU per door and level).
# A door may carry TTS_FEATURES for its server, DOOR:FEATURES (an A/B in one call: DOORS="http http:+resample_thread";
# the run is named DOOR-FEATURES). SPY=NAME: during that run, $SPY_AFTER s (30) into its loadtest, py-spy (from
# .whl) samples the server (RunPod: the worker) and the loadtest process for 10 s; their threads and main-thread
# leaves are printed.
# Usage: scripts/device/doors.sh   (env: DOORS="http serve runpod", LEVELS=64,256, MAX=256, FRAMES=192, PROCS=4,
#   FORMAT=pcm (loadtest --format: one or several, comma-separated), CKPT, CACHE; the servers take any TTS_*
#   exported. Needs runpod's wheels for the runpod door: .whl/rp/). TTS_TRACE_CHUNKS=on: the HTTP doors' breakdown
#   from /metrics, and the RunPod worker's per-job trace lines (logged at INFO then) summed up after the tables)
# On a CPU, the tiny checkpoint (stop 69's door A/B): PATH=<the CI venv>/bin:$PATH TTS_DEVICE=cpu MAX=8 FRAMES=24
#   CKPT=$PWD/tests/assets/golden/checkpoint LEVELS=4,4,4 PROCS=1 DOORS="http runpod:-runpod_pickup runpod"
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/doors}" 8000
DOORS=${DOORS:-http serve runpod} LEVELS=${LEVELS:-64,256} MAX=${MAX:-256} FRAMES=${FRAMES:-192} PROCS=${PROCS:-4}
FORMAT=${FORMAT:-pcm}
CKPT=${CKPT:-/tmp/s1-random} CACHE=${CACHE:-/tmp/doors-cache} PORT=${PORT:-8090}
URL=http://127.0.0.1:$PORT WARM=${LEVELS##*,}
if ! python3 -c "import runpod" 2>/dev/null && [ -d .whl/rp ]; then  # the device's Python has no runpod
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-rp .whl/rp/*.whl \
    >/dev/null 2>&1; export PYTHONPATH=$PYTHONPATH:/tmp/site-rp
fi
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
python3 -c "import torch; print('torch', torch.__version__)"
random_checkpoint "$CKPT" "$W/write.log" || exit 1
LOGLEVEL=WARNING; [ "${TTS_TRACE_CHUNKS:-off}" = on ] && LOGLEVEL=INFO  # tracing: the RunPod worker's lines are INFO
common=(TTS_MODEL_DIR="$CKPT" TTS_CACHE_DIR="$CACHE" TTS_DATA_DIR=/tmp/tts-data TTS_LOG_LEVEL=$LOGLEVEL
        TTS_MAX_BATCH="$MAX" TTS_FEATURES=auto)
lt() {  # lt DOOR PROCS: a warm-up level, then the measured ones, into $W/$name (one loadtest: runpod's queue lives in it)
  local t0; t0=$(date +%s)
  timeout 400 python3 -m ttsengine loadtest "$URL" --door "$1" --processes "$2" --max-new-tokens "$FRAMES" --format "$FORMAT" \
    --concurrency "$WARM,$LEVELS" --timeout 300 --out "$W/$name" > "$W/$name.log" 2>&1
  echo "loadtest $name exit $? ($(( $(date +%s) - t0 )) s)"; }
spy() {  # spy NAME SERVER_PID: in the background, py-spy on the server and on loadtest's main process
  [ "${SPY:-}" = "$1" ] || return 0
  local bin; bin=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  ( sleep "${SPY_AFTER:-30}"; lp=$(pgrep -f "^python3 -m ttsengine loadtest" | head -1)
    for p in "$2" "$lp"; do "$bin" record -p "$p" -d 10 -r 100 --threads --nonblocking -f raw \
      -o "$W/spy-$1-$p.txt" > "$W/spy.log" 2>&1 & done; wait
    for p in "$2" "$lp"; do echo "== py-spy $1 pid $p ($([ "$p" = "$2" ] && echo server || echo loadtest))"
      python3 scripts/device/spy_leaves.py "$W/spy-$1-$p.txt" 15; done > "$OUT/spy-$1.txt" 2>&1 ) & }
up() {  # up PID PATH: waits (300 s) for the server's PATH to answer 200; prints how long
  local t0; t0=$(date +%s)
  until curl -sf "$URL$2" >/dev/null; do
    kill -0 "$1" 2>/dev/null || { echo "server died"; return 1; }
    [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "not ready in 300 s"; return 1; }
    sleep 0.5
  done
  echo "ready after $(( $(date +%s) - t0 )) s"; }
RUNS=()
for entry in $DOORS; do
  door=${entry%%:*} feats=auto name=$door
  [ "$entry" != "$door" ] && feats=${entry#*:} name=$door-$(echo "${entry#*:}" | sed 's/+//g; s/-/no_/g; s/,/_/g')
  common[5]=TTS_FEATURES=$feats
  case $door in
    http)
      env "${common[@]}" TTS_PORT=$PORT python3 -m handlers http > "$W/server-$name.log" 2>&1 & pid=$!
      up $pid /ready && { spy "$name" $pid; lt http "$PROCS"; }; server_down $pid "$name" ;;
    serve)
      env "${common[@]}" SAGEMAKER_BIND_TO_PORT=$PORT python3 -m handlers serve > "$W/server-$name.log" 2>&1 & pid=$!
      up $pid /ping && { spy "$name" $pid; lt serve "$PROCS"; }; server_down $pid "$name" ;;
    runpod)  # the worker polls the queue loadtest hosts at $URL; loadtest waits for its first poll
      env "${common[@]}" RUNPOD_WEBHOOK_GET_JOB="$URL/job-take/\$ID?gpu=h200" \
        RUNPOD_WEBHOOK_POST_OUTPUT="$URL/job-done/\$RUNPOD_POD_ID/\$ID?gpu=h200" \
        RUNPOD_WEBHOOK_POST_STREAM="$URL/job-stream/\$RUNPOD_POD_ID/\$ID?gpu=h200" RUNPOD_POD_ID=doors \
        RUNPOD_SKIP_AUTO_SYSTEM_CHECKS=true RUNPOD_SKIP_GPU_CHECK=true python3 -m handlers runpod \
        > "$W/server-$name.log" 2>&1 & pid=$!
      spy "$name" $pid; lt runpod 1; server_down $pid "$name" ;;
    *) echo "unknown door $door"; continue ;;
  esac
  RUNS+=("$name")
done
wait  # a py-spy still summing
python3 scripts/device/http_breakdown_table.py "$W" "${RUNS[@]}" | tee "$OUT/table.txt"
cat "$OUT"/spy-*.txt 2>/dev/null
