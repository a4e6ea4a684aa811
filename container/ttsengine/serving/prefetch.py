"""The weights read from disk while a process imports (feature early_readahead): an entry point calls
read_weights_ahead() first thing, before torch and the web framework are imported (a few seconds of a warm start),
so the disk works meanwhile and the load finds the pages in memory. It needs only the configuration and a reader
(config.py, model/loading/readahead.py: no torch); the package imports its names lazily for this."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import read_ahead_paths
from ..model.loading.readahead import Readahead, weight_files


def read_weights_ahead(env: Mapping[str, str] | None = None) -> Readahead | None:
    """Starts reading the weight files the environment's model directory holds (and the newest converted codec in
    its cache directory) on background threads; None when there is nothing to read or the feature is off. Never
    raises for a bad or missing model: the start reports that."""
    paths = read_ahead_paths(env)
    files = weight_files(*paths) if paths is not None else []
    return Readahead(files) if files else None
