#!/usr/bin/env bash
# Two TTS_FEATURES variants of the codec in one device call, each on its own GPU at the same time (GPU 0: A, GPU 1:
# B; default A=auto, B=+codec_own_convs, stop 61's A/B; since own convs are on by default on sm_90, e.g.
# A=-codec_own_convs or B=+codec_fused_convs): the whole model in-process (`bench`, real S1-mini shapes, random
# weights, 256 streams, FRAMES frames each) and the codec alone (`bench --codec-only`, 8-frame chunks, 256/64/1
# streams: capture + warm-up s, frames/s). Prints one table per part.
# Usage: scripts/device/own_convs_ab.sh   (env: A, B, FRAMES=192, STREAMS=256, SWAP=1: the variants' GPUs swapped,
#        PARTS="model codec", OUT)
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/container:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TTS_MAX_BATCH=${STREAMS:-256}
VARIANTS=("${A:-auto}" "${B:-+codec_own_convs}")
[ "${SWAP:-0}" = 1 ] && VARIANTS=("${VARIANTS[1]}" "${VARIANTS[0]}")
PARTS=${PARTS:-model codec}
[[ $PARTS == *model* ]] && for i in 0 1; do
  CUDA_VISIBLE_DEVICES=$i TTS_FEATURES=${VARIANTS[$i]} timeout 200 python3 -m ttsengine bench --random-weights s1-mini \
    --frames "${FRAMES:-192}" --check-audio 0 --concurrency "${STREAMS:-256}" > "$OUT/ab-model-$i.log" 2>&1 &
done
wait
[[ $PARTS == *codec* ]] && for i in 0 1; do
  CUDA_VISIBLE_DEVICES=$i TTS_FEATURES=${VARIANTS[$i]} timeout 150 python3 -m ttsengine bench --codec-only \
    --random-weights s1-mini --concurrency 256,64,1 --chunk-frames 8 --seconds 4 --codec-modes engine \
    > "$OUT/ab-codec-$i.log" 2>&1 &
done
wait
for i in 0 1; do
  echo "## ${VARIANTS[$i]} (GPU $i): the model"
  grep -vE 'Warning|warn' "$OUT/ab-model-$i.log" | tail -6
  echo "## ${VARIANTS[$i]} (GPU $i): the codec alone"
  grep '^{' "$OUT/ab-codec-$i.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"| {r['streams']} | {r['warm_up_s']} s | {r['frames_per_s']:,} frames/s | {r['ms_per_call']} ms |\")"
done
