#!/usr/bin/env bash
# Local development set-up without Docker: a virtual environment with the engine, a smoke synthesis on the tiny
# test checkpoint, and (with HF_TOKEN set) the real S1-mini model in models/openaudio-s1-mini.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "setup: $*" >&2; exit 1; }
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
  || die "Python 3.10+ is needed (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11"

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv || die "could not create .venv (on Debian/Ubuntu: apt-get install python3-venv)"
fi
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c 'import torch' 2>/dev/null; then
  echo "setup: installing PyTorch"
  pip install -q torch || die "pip could not install torch; check your network or proxy settings"
fi
echo "setup: installing ttsengine"
pip install -q -e ".[download]" || die "pip install failed; see the messages above"

echo "setup: smoke test on the tiny test checkpoint"
python -m ttsengine synth --model tests/assets/golden/checkpoint --text "Hello there." \
  --max-new-tokens 20 --seed 1 --out /tmp/ttsengine-smoke.wav || die "the smoke synthesis failed"

if [ -n "${HF_TOKEN:-}" ]; then
  if [ ! -f models/openaudio-s1-mini/model.pth ]; then
    echo "setup: downloading fishaudio/openaudio-s1-mini"
    python -m ttsengine download --hf fishaudio/openaudio-s1-mini --to models/openaudio-s1-mini \
      || die "download failed; accept the licence at https://huggingface.co/fishaudio/openaudio-s1-mini"
  fi
  echo "setup: done. Try: python -m ttsengine synth --model models/openaudio-s1-mini --text 'Hello.' --out hello.wav"
else
  echo "setup: done. Set HF_TOKEN and run again to download the real model."
fi
