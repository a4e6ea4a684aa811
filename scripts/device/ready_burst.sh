#!/usr/bin/env bash
# Issue 44 ("ready means ready"), one device call (< 7 minutes with the default MODES): for each TTS_READY mode in
# $MODES, starts `python -m handlers http` (TTS_MAX_BATCH=256, real-size random S1-mini checkpoint, an EMPTY kernel
# cache dir), fires a loadtest burst (--concurrency C --requests C: every client sends one request at once) at 64
# then 256 the moment /ready answers 200, waits until /ready says no graph is pending (the same server, warm), fires
# the same bursts again, and prints one table: ready-after s, settled-after s, first audio p50/p95 per burst fresh vs
# warm, and the /ready JSON at the moment it turned 200 (what was captured, what pending, admit_streams).
# Usage: scripts/device/ready_burst.sh
#   env: MODES ("first"; "first all" adds the strict mode, ~3 more minutes), LEVELS (64,256), FRAMES (96: frames per
#        request), CKPT (/tmp/s1-random), BUDGET (s, 400: a mode is skipped when less than 120 s are left), PORT
set -uo pipefail
OUT=${OUT:-device-out}
W=${WORK:-/tmp/ready-burst}
mkdir -p "$OUT" "$W"
trap 'for f in "$W"/*.log; do echo "==== $f"; tail -c 20000 "$f"; done > "$OUT/logs.txt"; cp "$W"/*.json "$OUT"/ 2>/dev/null' EXIT
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
CKPT=${CKPT:-/tmp/s1-random} PORT=${PORT:-8080} LEVELS=${LEVELS:-64,256} FRAMES=${FRAMES:-96} MODES=${MODES:-first}
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('torch', torch.__version__, '| python', sys.version.split()[0])"
if [ ! -f "$CKPT/model.pth" ]; then
  t=$(date +%s)
  timeout 240 python3 -c "import sys; from ttsengine.model.checkpoint_writer import write_random_checkpoint as w; \
w('s1-mini', sys.argv[1], 'cuda')" "$CKPT" > "$W/write.log" 2>&1 || { tail -20 "$W/write.log"; exit 1; }
  echo "wrote $CKPT in $(( $(date +%s) - t )) s"
fi
URL=http://127.0.0.1:$PORT
bursts() {  # $1: name; one loadtest per level, each a burst of C requests from C clients
  local c t0
  for c in ${LEVELS//,/ }; do
    t0=$(date +%s)
    timeout 180 python3 -m ttsengine loadtest "$URL" --concurrency "$c" --requests "$c" --max-new-tokens "$FRAMES" \
      --out "$W/$1-$c" > "$W/$1-$c.log" 2>&1
    echo "  $1 burst of $c: exit $? ($(( $(date +%s) - t0 )) s)"
  done
  # one loadtest.json per name, levels joined (the table reads it)
  python3 -c "import json, sys; lv = [l for p in sys.argv[2:] for l in json.load(open(p + '/loadtest.json'))['levels']]
import os; os.makedirs(sys.argv[1], exist_ok=True); json.dump({'levels': lv}, open(sys.argv[1] + '/loadtest.json', 'w'))" \
    "$W/$1" $(for c in ${LEVELS//,/ }; do [ -f "$W/$1-$c/loadtest.json" ] && echo "$W/$1-$c"; done)
}
for mode in $MODES; do
  if [ "$(left)" -lt 120 ]; then echo "TTS_READY=$mode skipped: $(left) s left"; continue; fi
  echo "## TTS_READY=$mode, empty kernel cache"
  rm -rf "$W/cache-$mode"
  started=$(date +%s.%N)
  TTS_MODEL_DIR=$CKPT TTS_CACHE_DIR=$W/cache-$mode TTS_DATA_DIR=$W/data TTS_PORT=$PORT TTS_LOG_LEVEL=INFO \
    TTS_MAX_BATCH=256 TTS_READY=$mode python3 -m handlers http > "$W/$mode-server.log" 2>&1 &
  PID=$!
  if ! python3 scripts/device/ready_probe.py "$PORT" "$PID" "$started" 240 "$W/$mode-ready.json"; then
    tail -30 "$W/$mode-server.log"; kill $PID; wait $PID; continue
  fi
  bursts "$mode-fresh"
  wait_s=$(( $(left) - 60 )); [ $wait_s -gt 150 ] && wait_s=150; [ $wait_s -lt 10 ] && wait_s=10
  python3 scripts/device/ready_probe.py "$PORT" "$PID" "$started" "$wait_s" "$W/$mode-settled.json" --settled
  bursts "$mode-warm"
  kill -TERM $PID; wait $PID
  echo "server exit $?: $(grep -c Traceback "$W/$mode-server.log") tracebacks, captures logged:"
  grep -o "captured .*" "$W/$mode-server.log" | sed 's/^/    /' | tail -40
done
python3 scripts/device/ready_burst_table.py "$W" $MODES | tee "$OUT/table.txt"
