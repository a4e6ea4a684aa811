"""What a start begins before it imports torch and the web framework (a few seconds of a warm start): an entry point
calls read_weights_ahead() first thing, so the disk reads the weights meanwhile and the load finds the pages in
memory (feature early_readahead), and build_kernels_ahead(), so that on an empty kernel cache our Triton kernels
compile in background processes meanwhile (feature early_kernels). Both need only the configuration, a reader and
a process spawner (config.py, model/loading/readahead.py, engine/device/compile/early_kernels.py: no torch); the
package imports its names lazily for this."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from ..config import environment, kernels_ahead, read_ahead_paths
from ..engine.device.compile.early_kernels import build_ahead
from ..model.loading.readahead import Readahead, weight_files


def read_weights_ahead(env: Mapping[str, str] | None = None) -> Readahead | None:
    """Starts reading the weight files the environment's model directory holds (and the newest converted codec in
    its cache directory) on background threads; None when there is nothing to read or the feature is off. Never
    raises for a bad or missing model: the start reports that."""
    paths = read_ahead_paths(env)
    files = weight_files(*paths) if paths is not None else []
    return Readahead(files) if files else None


def build_kernels_ahead(env: Mapping[str, str] | None = None) -> list[subprocess.Popen]:
    """On a GPU machine whose kernel cache holds none of our Triton kernels yet, starts the processes that compile
    them (engine/device/compile/early_kernels.py) -> those processes (none otherwise). Never raises: a start that
    cannot spawn them compiles each kernel at its first use, as without the feature."""
    where = kernels_ahead(env)
    if where is None:
        return []
    try:
        return build_ahead(*where, environment() if env is None else dict(env))
    except OSError:
        return []
