#!/usr/bin/env bash
# Builds a local stand-in for the CUDA + PyTorch base (no registry can be pulled in CI):
# Debian bookworm (debootstrap, minbase) + Python 3.11 + the CPU torch wheel, imported as IMAGE.
# Usage: scripts/ci/base-image.sh IMAGE TORCH_VERSION CACHE_DIR   (skips when IMAGE exists)
set -euo pipefail
IMAGE=${1:?image name} TORCH=${2:?torch version} CACHE=${3:?cache dir}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "base image $IMAGE exists"; exit 0; fi
mkdir -p "$CACHE"
ROOTFS=$(mktemp -d)
trap 'rm -rf "$ROOTFS"' EXIT
TARBALL=$CACHE/bookworm-minbase-py311.tar
if [ ! -f "$TARBALL" ]; then
  debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm "$ROOTFS" \
    http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log" >&2; echo "base-image: debootstrap failed (log: $CACHE/debootstrap.log)" >&2; exit 1; }
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
  tar -C "$ROOTFS" -cf "$TARBALL.tmp" . && mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "${ROOTFS:?}"/*
fi
tar -C "$ROOTFS" -xf "$TARBALL"
# the torch wheel as this machine's pip finds it (a local CPU wheel where one exists)
WHEELS=$CACHE/wheels
mkdir -p "$WHEELS"
ls "$WHEELS"/torch-"$TORCH"* >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$WHEELS" "torch==$TORCH"
mkdir -p "$ROOTFS/tmp/wheels"
cp "$WHEELS"/torch-"$TORCH"* "$ROOTFS/tmp/wheels/"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/tmp/host-ca.crt"
# torch's own dependencies come from PyPI inside the chroot (a clean environment: the host's PIP_*
# settings point at host paths); the host's CA bundle covers TLS interception
chroot "$ROOTFS" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root sh -c 'python3 -m pip install -q --no-cache-dir --break-system-packages --cert /tmp/host-ca.crt \
  /tmp/wheels/torch-*.whl && rm -rf /tmp/wheels /tmp/host-ca.crt /root/.cache'
tar -C "$ROOTFS" -c . | docker import --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1 LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
docker run --rm "$IMAGE" python3 -c "import sys, torch; print('base', sys.version.split()[0], 'torch', torch.__version__)"
