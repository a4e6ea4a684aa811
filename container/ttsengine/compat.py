"""Differences between torch 2.2 (SageMaker's containers) and current torch, behind one module.

Everything here works by feature detection at call time; importing this module changes nothing.
"""

from __future__ import annotations

import functools
import pickle
import re
import zipfile
from pathlib import Path

import torch

from .errors import CheckpointError


@functools.cache
def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def load_torch_file(path: Path) -> object:
    """`torch.load` with `weights_only=True` always (2.2 defaults to False), mmap when the file allows.

    mmap needs the zip serialization format; old-format files are read without it.
    Unreadable files raise CheckpointError with one line naming the file.
    """
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        detail = re.search(r"Unsupported (global|class)[^.\n]*", text)
        if detail:  # a real pickle of something other than tensors: never unpickle it
            raise CheckpointError(f"{path}: refused to load: it holds objects other than tensors "
                                  f"({detail.group(0)})") from None
        last = text.strip().splitlines()[-1][:200] if text.strip() else "unpickling failed"
        raise CheckpointError(f"{path}: not a readable torch checkpoint (truncated or corrupt?): {last}") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable torch checkpoint (truncated or corrupt?): {first}") from None


def sdpa_supports_gqa() -> bool:
    """SDPA's `enable_gqa` arrived in torch 2.5."""
    return torch_version() >= (2, 5)


def compile_supported() -> bool:
    """torch.compile of the decode step needs custom ops whose pool mutation Inductor re-inplaces
    (auto_functionalized_v2, torch >= 2.6); older versions would copy the whole KV pool each step."""
    import torch.library

    return torch_version() >= (2, 6) and hasattr(torch.library, "custom_op")
