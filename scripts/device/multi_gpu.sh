#!/usr/bin/env bash
# Issue 19 on a two-GPU machine (nvidia-h200-x2), one device call: the fleet's GPU tests (replicas and split
# equal to one engine, one engine failing mid-run), then bench sweeps of the same build: one GPU, two replicas,
# the split topology. Usage: scripts/device/multi_gpu.sh [tests|bench|all]   (env: LEVELS1, LEVELS2, FRAMES)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
what=${1:-all}
export PYTHONPATH=$PWD/container:$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m | head -4
if [[ $what == tests || $what == all ]]; then
  echo "## GPU tests: tests/engine/test_fleet_gpu.py"
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_fleet_gpu.py > "$OUT/tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|^E " "$OUT/tests.log" | head -30
fi
if [[ $what == bench || $what == all ]]; then
  L1=${LEVELS1:-128,256}
  L2=${LEVELS2:-256,512}
  PER_RUN_S=${PER_RUN_S:-200} bash scripts/device/bench_runs.sh \
    "one-gpu||--devices cuda:0 --concurrency $L1" \
    "replicas||--devices cuda:0,cuda:1 --concurrency $L2" \
    "split||--devices cuda:0,cuda:1 --topology split --concurrency ${LEVELS_SPLIT:-$L2}"
fi
