#!/usr/bin/env bash
# Issue 49 on a 4-GPU machine (nvidia-h200-x4), one device call, real S1-mini shapes with random weights:
#   bench: `bench` in one process on 1, 2 and 4 GPUs (BENCH_MODES: off = engines as threads of this process, the old
#          layout; on = one engine process per GPU behind bench's front, as the server runs them), and the split
#          topology 3+1 (three DualARs, their codecs on the fourth GPU; 1+1 on a 2-GPU machine) in one process;
#   Runs that need more GPUs than the machine has are left out (a 2-GPU kind runs the 1- and 2-GPU rows).
#   http:  `python -m handlers http` with TTS_ENGINE_PROCESS=on on 1, 2 and 4 GPUs (HTTP_GPUS), each warmed once, then
#          `loadtest` at 256 streams per GPU (pcm, $PROCS client processes);
#   fail:  the 4-GPU server with TTS_TEST_FAIL_ENGINE=1@$FAIL_AT (engine 1 dies mid-run as with a lost GPU) under a
#          1,024-stream level: the other three serve, the failed streams end with an error, none hangs.
# Prints one table last (and the HTTP runs' server breakdown). Usage: PARTS="bench http fail" scripts/device/every_gpu.sh
#   (env: FRAMES=192, PER_GPU=256, PROCS=16, BENCH_MODES="off on", BENCH_GPUS="1 2 4", HTTP_GPUS="1 4", FAIL_AT=60,
#    BENCH_FEATURES="auto": TTS_FEATURES values, each an engine-process bench run of its own (e.g. "auto -short_switch
#    +plan_thread": the engine process's own hand-off, issue 43, without HTTP; short_switch is on by default), CKPT, CACHE)
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/every-gpu}" 12000
PARTS=${PARTS:-bench http fail} FRAMES=${FRAMES:-192} PER_GPU=${PER_GPU:-256} PROCS=${PROCS:-16}
BENCH_MODES=${BENCH_MODES:-off on} BENCH_GPUS=${BENCH_GPUS:-1 2 4} HTTP_GPUS=${HTTP_GPUS:-1 4} FAIL_AT=${FAIL_AT:-60}
CKPT=${CKPT:-/tmp/s1-random} CACHE=${CACHE:-/tmp/tts-cache} PORT=${PORT:-8080}
export TTS_CACHE_DIR=$CACHE
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
python3 -c "import torch, uvicorn; print('torch', torch.__version__, '| uvicorn', uvicorn.__version__)"
echo "cores: $(nproc)"
NGPU=$(nvidia-smi -L | wc -l)
fits() { local n out=""; for n in "$@"; do ((n <= NGPU)) && out+="${out:+ }$n"; done; echo "$out"; }
BENCH_GPUS=$(fits $BENCH_GPUS) HTTP_GPUS=$(fits $HTTP_GPUS)
gpus() { local n=$1 s="" i; for ((i = 0; i < n; i++)); do s+="${s:+,}cuda:$i"; done; echo "$s"; }
RUNS=()
part_bench() {
  b() { local label=$1 t0; t0=$(date +%s); shift
    TTS_FEATURES=${FEATS:-auto} timeout "${PER_RUN_S:-200}" python3 -m ttsengine bench --random-weights s1-mini \
      --frames "$FRAMES" --check-audio 0 --out "$W/$label" "$@" > "$W/$label.log" 2>&1
    echo "bench $label exit $? ($(( $(date +%s) - t0 )) s)"; RUNS+=("bench:$label"); }
  for n in 1 2 4; do
    for mode in $BENCH_MODES; do
      [[ " $BENCH_GPUS " != *" $n "* ]] && continue
      for f in ${BENCH_FEATURES:-auto}; do  # TTS_FEATURES variants, each a run of its own
        [[ $f != auto && $mode != on ]] && continue  # the engine-process features: their runs go through one
        # FEATS for this call only: the split run after the loop gets the defaults
        # shellcheck disable=SC2046 # no flag for off: bench's default layout
        FEATS=$f b "g$n-process-$mode$([[ $f != auto ]] && echo "${f//[^a-z_+-]/_}")" --devices "$(gpus $n)" \
          --concurrency $((n * PER_GPU)) $([[ $mode == on ]] && echo --engine-process on)
      done
    done
  done
  if ((NGPU >= 4)); then
    b "split-3+1" --devices cuda:0,cuda:3,cuda:1,cuda:3,cuda:2,cuda:3 --topology split --concurrency $((3 * PER_GPU))
  elif ((NGPU >= 2)); then
    b "split-1+1" --devices cuda:0,cuda:1 --topology split --concurrency "$PER_GPU"
  fi
}
if [[ " $PARTS " == *" http "* || " $PARTS " == *" fail "* ]]; then
  random_checkpoint "$CKPT" "$W/write.log" || exit 1
fi
URL=http://127.0.0.1:$PORT
serve() {  # serve NAME DEVICES [VAR=value ...]: starts the server, waits for /ready; sets PID
  local name=$1 devices=$2 t0; t0=$(date +%s); shift 2
  env "$@" TTS_MODEL_DIR="$CKPT" TTS_DATA_DIR=/tmp/tts-data TTS_PORT=$PORT TTS_LOG_LEVEL=WARNING \
    TTS_MAX_BATCH=$PER_GPU TTS_ENGINE_PROCESS=on TTS_DEVICES="$devices" python3 -m handlers http > "$W/server-$name.log" 2>&1 &
  PID=$!
  python3 scripts/device/wait_ready.py "$PORT" "$PID" 300 max_streams \
    || { tail -30 "$W/server-$name.log"; kill $PID; return 1; }
  echo "server $name ($devices): ready after $(( $(date +%s) - t0 )) s"
}
lt() { local name=$1 t0; t0=$(date +%s); shift; timeout 240 python3 -m ttsengine loadtest "$URL" \
  --max-new-tokens "$FRAMES" --processes "$PROCS" --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "loadtest $name exit $? ($(( $(date +%s) - t0 )) s)"; }
stop() { kill -TERM "$PID"; wait "$PID"; echo "server exit $?: $(grep -c Traceback "$W/server-$1.log") tracebacks"; }
part_http() {
  for n in $HTTP_GPUS; do
    c=$((n * PER_GPU))
    serve "g$n" "$(gpus "$n")" || continue
    lt "warm-g$n" --concurrency "$c" --requests "$c"
    lt "http-g$n" --concurrency "$c"; RUNS+=("http:http-g$n")
    stop "g$n"
  done
}
part_fail() {
  if serve fail "$(gpus "$NGPU")" TTS_TEST_FAIL_ENGINE="1@$FAIL_AT"; then
    lt "http-fail" --concurrency $((NGPU * PER_GPU)) --requests $((NGPU * PER_GPU)); RUNS+=("http:http-fail")
    curl -s "$URL/health" | head -c 600 > "$W/fail-health.json"; echo; echo "health: $(cat "$W/fail-health.json")"
    stop fail
  fi
}
for part in $PARTS; do "part_$part"; done  # in the order given
python3 scripts/device/every_gpu_table.py "$W" "${RUNS[@]}" | tee "$OUT/table.txt"
# the server's side of each HTTP run (its first-audio waterfall, per-thread CPU): where a multi-GPU front spends it
HTTP_RUNS=(); for r in "${RUNS[@]}"; do [[ $r == http:* ]] && HTTP_RUNS+=("${r#http:}"); done
[ ${#HTTP_RUNS[@]} = 0 ] || python3 scripts/device/http_breakdown_table.py "$W" "${HTTP_RUNS[@]}" | tee -a "$OUT/table.txt"
for r in "${RUNS[@]}"; do for j in "$W/${r#*:}"/*.json; do [ -f "$j" ] && cp "$j" "$OUT/${r#*:}-$(basename "$j")"; done; done
