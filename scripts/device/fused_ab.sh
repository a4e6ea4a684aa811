#!/usr/bin/env bash
# The decode step with each TTS_FEATURES setting, one after the other in one device call (same machine):
# graphed step ms per bucket and the uncaptured step's kernel profile (scripts/device/step_profile.py).
# Usage: scripts/device/fused_ab.sh [SETTING ...]
#   (default: -kernels -kernels,+fast_attention -kernels,+codebook_sampler auto)
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
for setting in "${@:--kernels -kernels,+fast_attention -kernels,+codebook_sampler auto}"; do
  for s in $setting; do
    echo "## TTS_FEATURES=$s"
    TTS_FEATURES=$s TTS_CACHE_DIR=${TTS_CACHE_DIR:-/tmp/kc} PYTHONUNBUFFERED=1 \
      timeout "${PER_RUN_S:-240}" python3 scripts/device/step_profile.py ${ROWS:-2 8 64} 2>&1 \
      | grep -E "^\||^uncaptured|^  +[0-9]|^top|Error" | grep -v -e "^| class" -e Constraint | head -${LINES_PER_RUN:-40}
  done
done
