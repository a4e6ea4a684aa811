#!/usr/bin/env bash
# Issue 44: where a start's seconds go, sampled rather than timed. After `coldstart.sh` (same WORK) has written the
# checkpoint and filled $WORK/kc-bf16, one device call:
#   importtime  a warm-cache start (`warm --until-first-audio`, page cache evicted) under `python -X importtime`:
#               every module's import, nested, on stderr ($OUT/importtime-dir.txt, the slowest lines printed);
#   spy CASE    the same start under py-spy (all threads, idle samples kept: a start waits on the disk and the GPU),
#               for CASE dir (the filled cache) and empty (a new cache directory): $OUT/spy-CASE.txt (raw, collapsed
#               stacks) and the main thread's time per stage printed by start_stages.py.
# Usage: QUANTS=bf16 CASES="empty dir" RUNS=1 bash scripts/device/coldstart.sh; bash scripts/device/start_spy.sh
#   env: WORK (/tmp/coldstart), SPY_CASES ("dir empty"), FEATURES (auto: TTS_FEATURES of every run here)
set -uo pipefail
. scripts/device/lib.sh
OUT=${OUT:-device-out} WORK=${WORK:-/tmp/coldstart} FEATURES=${FEATURES:-auto}
CK=$WORK/s1-mini KC=$WORK/kc-bf16
mkdir -p "$OUT"
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pyc}  # coldstart.sh's byte-compiled modules
[ -d "$KC" ] || { echo "no $KC: run coldstart.sh first (CASES=\"empty dir\")"; exit 1; }
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
start() {  # start CACHE_DIR [python options...]: one start, stderr and the JSON line to the caller's redirections
  local dir=$1; shift
  evict_pages "$CK" "$dir"
  TTS_FEATURES=$FEATURES TTS_MODEL_DIR="$CK" TTS_CACHE_DIR="$dir" TTS_QUANT=bf16 timeout 200 \
    "$@" -m ttsengine warm --model "$CK" --until-first-audio --no-blob --cache-dir "$dir"
}

start "$KC" python3 -X importtime > "$OUT/importtime-json.txt" 2> "$OUT/importtime-dir.txt"
echo "## importtime, warm cache directory: $(grep '^{' "$OUT/importtime-json.txt" | cut -c1-200)"
echo "## slowest imports (cumulative us, the module): top 25"
grep '^import time:' "$OUT/importtime-dir.txt" | awk -F'|' '{gsub(/ /, "", $2); print $2, $3}' | sort -rn | head -25

for c in ${SPY_CASES:-dir empty}; do
  dir=$KC; [ "$c" = empty ] && { dir=$WORK/kc-spy-empty; rm -rf "$dir"; }
  start "$dir" "$SPY" record --threads --idle -r 200 -f raw -o "$OUT/spy-$c.txt" -- python3 \
    > "$OUT/spy-$c.log" 2>&1
  echo "## py-spy, $c: $(grep '^{' "$OUT/spy-$c.log" | cut -c1-200)"
  python3 scripts/device/start_stages.py "$OUT/spy-$c.txt"
done
