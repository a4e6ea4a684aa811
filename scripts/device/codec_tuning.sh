#!/usr/bin/env bash
# Issue 44: what cuDNN's tuning of the codec costs at start and what it buys. The codec alone (`bench --codec-only`,
# engine mode: the engine's layout, Snake kernel, graphs of 1..64 rows, tuned in the capture windows), one process per
# setting (cuDNN keeps a process-wide cache of tuned shapes), each on its own GPU when the machine has several:
#   limit N: torch.backends.cudnn.benchmark_limit = N (algorithms cuDNN times per shape; torch's default 10, 0 = all;
#            1 = cuDNN's first heuristic pick, timed alone), then --concurrency 64,1: warm_up_s at 64 is the capture of
#            every bucket 1..64 with its tuning; frames/s at 64 and at 1 stream
#   untuned: the channel-major codec without tuning (TTS_FEATURES=-cudnn_tuning's layout)
# Usage: scripts/device/codec_tuning.sh   (env: LIMITS="10 4 2 1", GPUS: how many to spread over, from FIRST_GPU=0)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LIMITS=${LIMITS:-10 4 2 1}
n=${GPUS:-$(nvidia-smi -L | wc -l)}
i=0
for spec in $LIMITS untuned; do
  gpu=$((i % n + ${FIRST_GPU:-0})); i=$((i + 1))
  if [ "$spec" = untuned ]; then modes=snake limit=10; else modes=engine limit=$spec; fi
  CUDA_VISIBLE_DEVICES=$gpu python3 - "$limit" "$modes" > "$OUT/codec-$spec.log" 2>&1 <<'PY' &
import runpy, sys, time
import torch
torch.backends.cudnn.benchmark_limit = int(sys.argv[1])
modes = sys.argv[2]
sys.argv = ["ttsengine", "bench", "--codec-only", "--random-weights", "s1-mini", "--concurrency", "64,1",
            "--chunk-frames", "8", "--seconds", "4", "--codec-modes", modes]
t0 = time.time()
runpy.run_module("ttsengine", run_name="__main__")
PY
  # one setting per GPU at a time: the next on the same GPU waits for it
  if (( i % n == 0 )); then wait; fi
done
wait
printf '| setting | streams | capture + warm-up s | frames/s | ms per call |\n|---|---|---|---|---|\n'
for spec in $LIMITS untuned; do
  grep '^{' "$OUT/codec-$spec.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"| $spec | {r['streams']} | {r['warm_up_s']} | {r['frames_per_s']:,} | {r['ms_per_call']} |\")"
  grep -E 'Error|error' "$OUT/codec-$spec.log" | head -3
done
