#!/usr/bin/env bash
# Regenerates docker/requirements.lock: a clean Python 3.11 venv with the image's runtime dependencies
# (the package's own, and its http, runpod and download extras), frozen. torch and what torch pulls are
# left out: the base image provides them.
set -euo pipefail
cd "$(dirname "$0")/../.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3.11 -m venv "$TMP/venv"
mapfile -t reqs < <(python3.11 -c "
import tomllib
p = tomllib.load(open('pyproject.toml', 'rb'))['project']
x = p['optional-dependencies']
for r in p['dependencies'] + x['http'] + x['runpod'] + x['download']:
    if not r.startswith('torch'):
        print(r.split(';')[0].split('#')[0].strip())")
"$TMP/venv/bin/pip" install -q "${reqs[@]}"
{
  sed -n '1,3p' docker/requirements.lock
  # nvidia-ml-py (NVML bindings, pure Python) is ours; the other nvidia-* packages are torch's CUDA libraries
  "$TMP/venv/bin/pip" freeze | grep -v -i -P \
    "^(torch|triton|sympy|mpmath|networkx|jinja2|markupsafe|filelock|fsspec|setuptools|pip|typing.extensions)[=-]|^nvidia-(?!ml-py=)"
} > "$TMP/lock"
mv "$TMP/lock" docker/requirements.lock
echo "wrote docker/requirements.lock ($(grep -vc '^#' docker/requirements.lock) pins)"
