# fish-tts-server: one image for `docker compose up`, SageMaker (`serve`) and RunPod (`runpod`).
#
# BASE_IMAGE: an official CUDA + PyTorch runtime image with Python 3.11 (see docs/deploy-compose.md, "The image").
# CI builds FROM a local Debian bookworm + Python 3.11 + CPU torch stand-in (scripts/ci/base-image.sh).
# Builds with the legacy builder (no BuildKit features). Optional build args:
#   BAKE_MODEL=1      copy the model dir placed in docker/models/ into the image (/opt/ml/model), for
#                     cold-start-sensitive RunPod endpoints; default: no weights in the image.
#   a CA bundle at docker/extra-ca.crt (git-ignored) is trusted by pip during the build (TLS-intercepting
#   proxies).
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

# ---- stage 1: our package as a wheel (no build tools or sources in the final image) -------------------
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
RUN python3 -c "import sys, torch; assert sys.version_info[:2] == (3, 11)" \
    || { echo "BASE_IMAGE must provide Python 3.11 with torch (python3 -c 'import torch')" >&2; exit 1; }
COPY docker/ /tmp/docker/
COPY pyproject.toml README.md ./
COPY container/ container/
COPY handlers/ handlers/
RUN if [ -f /tmp/docker/extra-ca.crt ]; then export PIP_CERT=/tmp/docker/extra-ca.crt; fi \
    && python3 -m pip wheel --no-cache-dir --no-deps -w /wheels .

# ---- stage 2: the runtime ------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG BAKE_MODEL=0
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TTS_MODEL_DIR=/opt/ml/model \
    TTS_DATA_DIR=/data \
    TTS_CACHE_DIR=/cache \
    TTS_HOST=0.0.0.0 \
    RUNPOD_DEBUG_LEVEL=INFO
# a C compiler and Python.h: Triton builds its launcher with them, Inductor's CPU backend needs g++
# hadolint ignore=DL3008
RUN if ! command -v g++ >/dev/null || ! python3 -c "import sysconfig, os, sys; \
        sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then \
        apt-get update && apt-get install -y --no-install-recommends gcc g++ libc6-dev python3-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
COPY docker/ /tmp/docker/
# pinned dependencies; torch stays the base's (a constraint on its installed version forbids a reinstall)
RUN if [ -f /tmp/docker/extra-ca.crt ]; then export PIP_CERT=/tmp/docker/extra-ca.crt; fi \
    && python3 -c "import torch; print('torch==' + torch.__version__)" > /tmp/torch-pin.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/torch-pin.txt -r /tmp/docker/requirements.lock \
    && python3 -c "import torch, sys; sys.exit(0 if 'torch==' + torch.__version__ == open('/tmp/torch-pin.txt').read().strip() else 'torch changed')"
COPY --from=wheel /wheels/ /tmp/wheels/
# bytecode for every installed module and the standard library (a base image may ship it without): with
# PYTHONDONTWRITEBYTECODE a module without its .pyc is compiled again at every start (torch._dynamo/_inductor's ~1,400
# modules cost ~5 s of a warm start on the H100 machine; asyncio, unittest, email... ~0.4 s on the H200 one; a
# module that has its .pyc costs nothing here). compileall's exit status is ignored: a package's non-Python-3
# data file only lacks a .pyc.
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/docker /tmp/torch-pin.txt \
    && { python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
         "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" >/dev/null || true; } \
    && mkdir -p /opt/ml/model /data /cache
# TTS_MODEL_SOURCE=tiny: the tiny random test model (1.7 MB), to try the server without the gated weights
COPY tests/assets/golden/checkpoint/ /opt/tts/tiny-model/
COPY docker/models/ /opt/ml/baked/
RUN if [ "$BAKE_MODEL" = "1" ]; then \
        cp -r /opt/ml/baked/. /opt/ml/model/ && python3 -c "from ttsengine.serving.download import verify_model_dir; verify_model_dir('/opt/ml/model')"; \
    fi; rm -rf /opt/ml/baked
EXPOSE 8080
# SageMaker opens /invocations-bidirectional-stream (serve: Fish's live protocol) only for images that say so
LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true
# by mode (read from PID 1's command line): http -> /health, serve -> /ping, runpod -> the worker is alive
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 CMD ["python3", "-m", "handlers.healthcheck"]
ENTRYPOINT ["python3", "-m", "handlers"]
CMD ["http"]
