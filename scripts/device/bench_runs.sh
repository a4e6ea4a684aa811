#!/usr/bin/env bash
# Several `bench` runs of this tree in one device call, each with its own settings, sharing one kernel cache
# (the first start compiles, the rest load). Prints each run's table; JSON and HTML land in $OUT/LABEL.
# Usage: scripts/device/bench_runs.sh 'LABEL|ENV|BENCH ARGS' ...
#   ENV: space-separated VAR=value pairs (may be empty); BENCH ARGS: e.g. --concurrency 64 --voice 10
#   env: FRAMES (192), PER_RUN_S (timeout per run, 240)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
for spec in "$@"; do
  IFS='|' read -r label envs args <<< "$spec"
  echo "## $label: ${envs:-defaults} | $args"
  # shellcheck disable=SC2086 # word splitting of ENV and ARGS is the point
  env $envs PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TTS_CACHE_DIR=/tmp/kc \
    timeout "${PER_RUN_S:-240}" python3 -m ttsengine bench --random-weights s1-mini --frames "${FRAMES:-192}" \
    --out "$OUT/$label" $args > "$OUT/$label.log" 2>&1
  echo "exit $?"
  grep -E "memory preset|^concurrency|^[0-9]+ \||per engine|highest|Error|error:" "$OUT/$label.log" | grep -v "it/s" | tail -16
done
