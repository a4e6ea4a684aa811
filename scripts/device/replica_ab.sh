#!/usr/bin/env bash
# Issue 19 on a two-GPU machine, one device call: where the in-process replicas lose to two separate GPUs.
#   fleet     one process, engines on cuda:0 and cuda:1 (what TTS_DEVICES=auto serves), LEVEL2 streams
#   fleet-si  the same with Python's thread switch interval at SI seconds (default 5 ms): GIL hand-offs
#   procs     two processes started together, one GPU each, LEVEL1 streams each (one process per GPU)
# Each run repeats its level REPEAT times so the two processes' middle levels overlap whatever their start
# offsets; compare the middle levels. Usage: scripts/device/replica_ab.sh   env: LEVEL1 (256) LEVEL2 (512)
#   REPEAT (4) SI (0.0005) FRAMES (192) PER_RUN_S (180: three phases must fit one 600 s device call)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
L1=${LEVEL1:-256} L2=${LEVEL2:-512} N=${REPEAT:-4}
levels() { local l=$1 s=$1; for _ in $(seq 2 "$N"); do s="$s,$l"; done; echo "$s"; }
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TTS_CACHE_DIR=/tmp/kc
nvidia-smi --query-gpu=index,name --format=csv,noheader
bench() {  # bench LABEL SWITCH_INTERVAL ARGS...
  local label=$1 si=$2; shift 2
  timeout "${PER_RUN_S:-180}" python3 -c 'import runpy, sys
sys.setswitchinterval(float(sys.argv[1])); sys.argv = ["ttsengine"] + sys.argv[2:]
runpy.run_module("ttsengine", run_name="__main__")' "$si" bench --random-weights s1-mini --frames "${FRAMES:-192}" \
    --out "$OUT/$label" "$@" > "$OUT/$label.log" 2>&1
  echo "## $label (switch interval $si s): exit $?"
  grep -E "^concurrency|^[0-9]+ \||per engine|Error|error:" "$OUT/$label.log" | grep -v "it/s" | tail -12
}
bench fleet 0.005 --devices cuda:0,cuda:1 --concurrency "$(levels "$L2")"
bench procs-0 0.005 --devices cuda:0 --concurrency "$(levels "$L1")" &
bench procs-1 0.005 --devices cuda:1 --concurrency "$(levels "$L1")" &
wait
bench fleet-si "${SI:-0.0005}" --devices cuda:0,cuda:1 --concurrency "$(levels "$L2")"
