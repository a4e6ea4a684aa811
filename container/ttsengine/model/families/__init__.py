"""Checkpoint families: the registry. Each family is a module with the members of `Family` (family.py; s1.py is
one), checked when this package is imported; `detect` picks the one a model directory belongs to."""

from __future__ import annotations

from pathlib import Path

from ...errors import CheckpointError
from . import s1
from .family import Family, check

FAMILIES: tuple[Family, ...] = tuple(check(family) for family in (s1,))  # a family lacking a member fails here


def detect(model_dir: Path) -> Family:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: model directory not found")
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir}: no config.json (is this a model directory?)")
    for family in FAMILIES:
        if family.matches(model_dir):
            return family
    raise CheckpointError(f"{model_dir}/config.json: not a supported checkpoint family "
                          f"(supported: {', '.join(f.NAME for f in FAMILIES)}; S1 needs model_type 'dual_ar')")
