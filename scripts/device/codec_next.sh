#!/usr/bin/env bash
# Issues 44 and 46, the codec switches added without a GPU (stop 54), in one device call:
#   1. their GPU tests: the KV ring captured in graphs against the plain codec, bf16 streaming with the ring;
#   2. the codec alone (`bench --codec-only --codec-modes engine`, real S1-mini shapes, random weights, 8-frame
#      chunks) per TTS_FEATURES variant, one process per variant (cuDNN's tuned shapes are process-wide), each on its
#      own GPU when the machine has several: capture + warm-up s at the first level (every graph 1..64 rows and its
#      cuDNN tuning: codec_sparse_rows should halve it), frames/s at 256, 64 and 1 streams (codec_kv_ring should
#      raise 256's: issue 46's target is 60,000).
# Stop 60: VARIANTS="- +codec_own_convs" (the codec's convs as GEMMs of our own: no cuDNN plan per graph, so the
# capture + warm-up column is issue 44's start lever; frames/s against cuDNN's tuned convs is issue 46's).
# Usage: scripts/device/codec_next.sh   (env: VARIANTS, space-separated TTS_FEATURES values, "-" for the defaults;
#        LEVELS="256,64,1"; GPUS: how many to spread over, from FIRST_GPU=0; TESTS=0 skips part 1)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
VARIANTS=${VARIANTS:-- +codec_kv_ring +codec_sparse_rows +codec_kv_ring,+codec_sparse_rows}
LEVELS=${LEVELS:-256,64,1}
if [ "${TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py \
    -k "kv_ring or streaming_decode or codec or own_conv" 2>&1 | tail -5
fi
n=${GPUS:-$(nvidia-smi -L | wc -l)}
i=0
for v in $VARIANTS; do
  gpu=$((i % n + ${FIRST_GPU:-0})); i=$((i + 1))
  features=$([ "$v" = - ] && echo auto || echo "$v")
  name=${v//[^a-z_+-]/_}
  CUDA_VISIBLE_DEVICES=$gpu TTS_FEATURES=$features python3 -m ttsengine bench --codec-only --random-weights s1-mini \
    --concurrency "$LEVELS" --chunk-frames 8 --seconds 4 --codec-modes engine > "$OUT/codec-next-$name.log" 2>&1 &
  if (( i % n == 0 )); then wait; fi  # one variant per GPU at a time
done
wait
printf '| TTS_FEATURES | streams | capture + warm-up s | frames/s | ms per call |\n|---|---|---|---|---|\n'
for v in $VARIANTS; do
  name=${v//[^a-z_+-]/_}
  grep '^{' "$OUT/codec-next-$name.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"| $v | {r['streams']} | {r['warm_up_s']} | {r['frames_per_s']:,} | {r['ms_per_call']} |\")"
  grep -E 'Error|error' "$OUT/codec-next-$name.log" | head -3
done
