#!/usr/bin/env bash
# The product through its front door, one device call, one GPU, real S1-mini shapes with random weights, defaults
# (TTS_MAX_BATCH=$MAX streams, goodput admission on as on any GPU):
#   bench:    `bench` in-process at $MAX streams (the engine's figure the HTTP runs are held against; issue 43);
#   cold:     `python -m handlers http` on an empty kernel cache: ready after (settled), then at once the first
#             burst ($MAX clients, one request each; issue 44), then the same load warm (2 requests per client);
#   overload: 2 x $MAX clients against the same server (issue 50: admitted streams >= 1.2x real time, the rest 503);
#   clients:  the steady load again with loadtest's httpx client and with 2 x $PROCS raw-client processes (issue 43:
#             is the load generator part of what the clients see?);
#   live:     `livetest`: one session (first audio, barge-in), then each of $SESSIONS sessions at 30 tokens/s,
#             over each of $LIVE_PROCS client processes (issue 45);
#   warm:     the server restarted on the filled kernel cache: ready after, and its first burst (issue 44);
#   restart:F the server restarted on the filled kernel cache with TTS_FEATURES=F ("-": the defaults); the parts
#             after it run against that server, their runs named after it (an A/B of a server feature in one call:
#             PARTS="cold live restart:+segment_slack live restart:- live");
#   benchopen:R: `bench` open loop, 2 x $MAX requests at R/s (Poisson), in-process and through the engine process;
#   open:R:   the same arrivals through HTTP against the server now running (issue 43: the same load at each door);
#   burst, steady: cold's two loads again against the server now running (named after it), e.g.
#             PARTS="cold restart:+slack_prefill burst steady restart:- burst steady";
#   burst:N:  N requests at once, one each (issue 44 with int8: TTS_QUANT=int8 PARTS="cold restart:- burst:64
#             burst:64 restart:- burst:256 burst:256": each size at a warm restart's ready, then once warm).
#   A run named again gets -2, -3, ... after its name.
# Prints the tables last. Usage: scripts/device/front_door.sh   (env: PARTS="bench cold overload live warm",
#   MAX=256, FRAMES=192, PROCS=4, SESSIONS=64, LIVE_PROCS=$PROCS (a list; repeats run again), BENCH_RUNS=1
#   (bench's first audio at 256 moves between runs: several show how much),
#   BENCH_FEATURES="- -codec_sparse_rows" (TTS_FEATURES per bench run), LIVE_JSON=0 (1: every live run's turns
#   come back as NAME.json; the full livetest output is in live.txt, one line per run in table.txt),
#   SERVER_LOG=WARNING (INFO: its start's captures, kept in $OUT/server-NAME-start.txt), CKPT, CACHE; the server takes
#   any TTS_* exported, e.g. TTS_TRACE_CHUNKS=on)
set -uo pipefail
. scripts/device/lib.sh
device_setup "${WORK:-/tmp/front-door}" 8000
PARTS=${PARTS:-bench cold overload live warm} MAX=${MAX:-256} FRAMES=${FRAMES:-192} PROCS=${PROCS:-4}
SESSIONS=${SESSIONS:-64} LIVE_PROCS=${LIVE_PROCS:-$PROCS} BENCH_RUNS=${BENCH_RUNS:-1}
SERVER_LOG=${SERVER_LOG:-WARNING} BENCH_FEATURES=${BENCH_FEATURES:--}
CKPT=${CKPT:-/tmp/s1-random} CACHE=${CACHE:-/tmp/front-door-cache} PORT=${PORT:-8080}
URL=http://127.0.0.1:$PORT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, uvicorn; print('torch', torch.__version__, '| uvicorn', uvicorn.__version__)"
random_checkpoint "$CKPT" "$W/write.log" || exit 1
RUNS=()
lt() { local name=$1 base=$1 t0 k=2; t0=$(date +%s); shift
  while [[ " ${RUNS[*]} " == *" $name "* ]]; do name="$base-$k"; k=$((k + 1)); done  # a repeat: NAME-2, ...
  timeout 240 python3 -m ttsengine loadtest "$URL" \
  --max-new-tokens "$FRAMES" --processes "$PROCS" --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "loadtest $name exit $? ($(( $(date +%s) - t0 )) s)"; RUNS+=("$name"); }
SRV=cold PFX=  # the server now running; a restart's live runs carry its name ($PFX)
live() { local name=$1; shift; timeout 240 python3 -m ttsengine livetest "$URL" --out "$W/$name" "$@" \
  > "$W/$name.log" 2>&1; echo "livetest $name exit $?"; LIVE+=("$name")
  [ "${LIVE_JSON:-0}" = 0 ] || cp "$W/$name/livetest.json" "$OUT/$name.json" 2>/dev/null; }  # every turn's record
serve() {  # serve NAME: starts the server, waits for a settled /ready; sets PID
  local t0; t0=$(date +%s.%N)
  TTS_MODEL_DIR="$CKPT" TTS_CACHE_DIR="$CACHE" TTS_DATA_DIR=/tmp/tts-data TTS_PORT=$PORT TTS_LOG_LEVEL=$SERVER_LOG \
    TTS_MAX_BATCH=$MAX python3 -m handlers http > "$W/server-$1.log" 2>&1 &
  PID=$!
  python3 scripts/device/wait_ready.py "$PORT" "$PID" 300 kernel_cache max_streams features \
    || { tail -30 "$W/server-$1.log"; kill $PID; return 1; }
  echo "server $1: ready after $(python3 -c "import time; print(round(time.time() - $t0, 1))") s (process start)"
}
stop() { server_down "$PID" "$1"
  grep -E "captured|ready|warm|load|compil|cache" "$W/server-$1.log" | grep -v "\"GET " | cut -c1-220 \
    > "$OUT/server-$1-start.txt"; }
LIVE=()
for part in $PARTS; do
  case $part in
    bench) for f in $BENCH_FEATURES; do  # one bench per TTS_FEATURES value ("-": the defaults, into $W/bench)
             for r in $(seq 1 "$BENCH_RUNS"); do  # runs after the first: $W/bench...-runN
               d=$([ "$f" = - ] && echo bench || echo "bench${f//[^a-z_+-]/_}")$([ "$r" = 1 ] || echo "-run$r")
               TTS_FEATURES=$([ "$f" = - ] && echo auto || echo "$f") timeout 300 python3 -m ttsengine bench \
                 --random-weights s1-mini --frames "$FRAMES" --concurrency "$MAX" --check-audio 0 --out "$W/$d" \
                 > "$W/$d.log" 2>&1; echo "bench $f run $r exit $?"
             done
           done ;;
    benchopen:*) r=${part#benchopen:}  # open loop in-process, then through the engine process: 2 x $MAX at RATE/s
             for ep in off on; do d=bench-open$r$([ $ep = off ] || echo -ep)
               timeout 300 python3 -m ttsengine bench --random-weights s1-mini --frames "$FRAMES" --check-audio 0 \
                 --concurrency $((2 * MAX)) --arrivals "poisson:$r" --engine-process $ep --out "$W/$d" \
                 > "$W/$d.log" 2>&1; echo "bench open $r engine-process $ep exit $?"; done ;;
    open:*) lt "${PFX}open${part#open:}" --concurrency "$MAX" --requests $((2 * MAX)) --arrivals "poisson:${part#open:}" ;;
    cold) rm -rf "$CACHE"; serve cold || exit 1
          lt burst-cold --concurrency "$MAX" --requests "$MAX"; lt steady --concurrency "$MAX" ;;
    overload) lt overload --concurrency $((2 * MAX)) ;;
    burst) lt "${PFX}burst" --concurrency "$MAX" --requests "$MAX" ;;  # $MAX at once, one request each
    burst:*) lt "${PFX}burst${part#burst:}" --concurrency "${part#burst:}" --requests "${part#burst:}" ;;
    steady) lt "${PFX}steady" --concurrency "$MAX" ;;
    clients) lt steady-httpx --concurrency "$MAX" --client httpx
             lt "steady-p$((2 * PROCS))" --concurrency "$MAX" --processes $((2 * PROCS)) ;;
    live) live "${PFX}live-1" --sessions 1 --turns 3 --max-new-tokens 128
          live "${PFX}barge-1" --sessions 1 --turns 3 --barge-in 0.5
          for n in $SESSIONS; do
            for p in $LIVE_PROCS; do  # a repeated count gets its own name: live-64-p1, live-64-p1-2
              name="${PFX}live-$n-p$p" k=2
              while [[ " ${LIVE[*]} " == *" $name "* ]]; do name="${PFX}live-$n-p$p-$k"; k=$((k + 1)); done
              live "$name" --sessions "$n" --ramp 2 --max-new-tokens 128 --processes "$p"
            done
          done ;;
    warm) stop "$SRV"; SRV=warm; serve warm || exit 1; lt burst-warm --concurrency "$MAX" --requests "$MAX"
          stop warm; SRV=stopped ;;
    restart:*) f=${part#restart:}; stop "$SRV"; SRV=$([ "$f" = - ] && echo default || { f2=${f//-/no}; echo "${f2//[^a-z_]/}"; })
               k=2; while [ -f "$W/server-$SRV.log" ]; do SRV="${SRV%-[0-9]*}-$k"; k=$((k + 1)); done
               TTS_FEATURES=$([ "$f" = - ] && echo auto || echo "$f") serve "$SRV" || exit 1; PFX="$SRV-" ;;
  esac
done
[ "$SRV" = stopped ] || stop "$SRV"
python3 scripts/device/http_breakdown_table.py "$W" "${RUNS[@]}" | tee "$OUT/table.txt"
for n in "${LIVE[@]}"; do echo "== $n"; grep -v '^wrote' "$W/$n.log"; done > "$OUT/live.txt"
[ ${#LIVE[@]} = 0 ] || python3 scripts/device/live_table.py "$W" "${LIVE[@]}" | tee -a "$OUT/table.txt"
[ -f "$W/bench/bench.json" ] && cp "$W/bench/bench.json" "$OUT/bench.json"
