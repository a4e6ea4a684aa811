#!/usr/bin/env bash
# Before/after benchmarks in one device call: the same `bench` sweep on several source trees, one after
# the other on the same GPU (machines are noisy; compare only within one call). Each tree gets its own
# kernel cache (its first start compiles). Prints each tree's table; JSON and HTML land in $OUT/LABEL.
# Usage: scripts/device/ab_bench.sh LEVELS LABEL=TREE [LABEL=TREE ...]
#   TREE: a checkout or `git archive` of a commit (its container/ is put on PYTHONPATH)
#   env: FRAMES (192), BENCH_ARGS (extra bench flags), PER_TREE_S (timeout per tree, 200)
set -uo pipefail
LEVELS=${1:?levels, e.g. 1,8,64}
shift
OUT=${OUT:-device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
for spec in "$@"; do
  label=${spec%%=*} tree=$(cd "${spec#*=}" && pwd)
  echo "## $label ($tree)"
  ( cd "$tree" && PYTHONPATH=$tree/container:$tree${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TTS_CACHE_DIR=/tmp/kc-$label \
    timeout "${PER_TREE_S:-200}" python3 -m ttsengine bench --random-weights s1-mini --concurrency "$LEVELS" \
    --frames "${FRAMES:-192}" --out "$OUT/$label" ${BENCH_ARGS:-} > "$OUT/$label.log" 2>&1 )
  echo "exit $?"
  sed -n '/^NVIDIA\|^cpu /,$p' "$OUT/$label.log" | grep -v "it/s" | tail -12
done
