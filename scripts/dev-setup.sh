#!/usr/bin/env bash
# Local development set-up without Docker: a virtual environment with the engine and everything the README's
# commands use (synth, download, the HTTP server), a smoke synthesis on the tiny test checkpoint, and (with
# HF_TOKEN set) the real S1-mini model in models/openaudio-s1-mini.
# Safe to run again: each step is skipped when already done.
#   --cpu   install PyTorch's CPU build from PyTorch's own index (~0.7 GB instead of ~5.6 GB for the CUDA
#           build PyPI serves); what a machine without an NVIDIA GPU wants
#   TORCH_SPEC=...  the torch requirement to install (default: torch)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "setup: $*" >&2; exit 1; }
CPU=0
for arg in "$@"; do
  case $arg in
    --cpu) CPU=1 ;;
    *) die "unknown option $arg (options: --cpu)" ;;
  esac
done
START=$(date +%s)
step() { echo "setup: $* ($(( $(date +%s) - START )) s)"; }
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
  if [ "$CPU" = 1 ]; then
    step "installing PyTorch's CPU build (about 0.7 GB) from https://download.pytorch.org/whl/cpu"
    pip install --progress-bar on "${TORCH_SPEC:-torch}" --index-url https://download.pytorch.org/whl/cpu \
      || die "pip could not install torch from PyTorch's CPU index; check your network or proxy settings"
  else
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
      echo "setup: no NVIDIA GPU here: the default torch from PyPI is the CUDA build (~5.6 GB). For the CPU"
      echo "       build (~0.7 GB) stop now (Ctrl-C) and run: scripts/dev-setup.sh --cpu"
    fi
    step "installing PyTorch (${TORCH_SPEC:-torch}; several GB, a few minutes)"
    pip install --progress-bar on "${TORCH_SPEC:-torch}" || die "pip could not install torch; check your network or proxy settings"
  fi
fi
step "installing ttsengine with the HTTP server and the model download (.[http,download])"
pip install -q -e ".[http,download]" || die "pip install failed; see the messages above"
python -c "import fastapi, uvicorn, multipart" || die "the HTTP server's packages did not install"

step "smoke test on the tiny test checkpoint"
python -m ttsengine synth --model tests/assets/golden/checkpoint --text "Hello there." \
  --max-new-tokens 20 --seed 1 --out /tmp/ttsengine-smoke.wav || die "the smoke synthesis failed"

if [ -n "${HF_TOKEN:-}" ]; then
  if [ ! -f models/openaudio-s1-mini/model.pth ]; then
    echo "setup: downloading fishaudio/openaudio-s1-mini"
    python -m ttsengine download --hf fishaudio/openaudio-s1-mini --to models/openaudio-s1-mini \
      || die "download failed; accept the licence at https://huggingface.co/fishaudio/openaudio-s1-mini"
  fi
  step "done. Try: . .venv/bin/activate && python -m ttsengine synth --model models/openaudio-s1-mini --text 'Hello.' --out hello.wav"
  echo "       or the server: TTS_MODEL_DIR=models/openaudio-s1-mini python -m handlers http"
else
  step "done. Set HF_TOKEN and run again to download the real model; the server on the tiny test model:"
  echo "       . .venv/bin/activate && TTS_MODEL_SOURCE=tiny TTS_MODEL_DIR=models/tiny python -m handlers http"
fi
