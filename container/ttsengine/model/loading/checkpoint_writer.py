"""Writing a model directory in the real S1-mini file format: what `--random-weights NAME --write-checkpoint DIR`
puts on disk, so a measurement reads real-size files the way the real model is read.

Files, as fishaudio/openaudio-s1-mini ships them (spec §1): `config.json` (upstream's save routine: sorted keys,
4-space indent), `tokenizer.tiktoken` (`base64 rank` lines), `special_tokens.json` (token -> id, in id order),
`model.pth` (a plain state_dict in bf16) and `codec.pth` (fp32 parameters with weight norm stored as (g, v) plus
the transformers' bf16/bool buffers: codec_file_layout.py); plus `codec_config.json` for a codec that is not
the built-in S1 one. Everything goes into a sibling temporary directory that is renamed into place at the end,
so an interrupted write never leaves a directory that looks complete.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ..state_dict import StateDict
from .codec_file_layout import to_file_layout
from .weights import upstream_order

# headroom over the tensors' bytes for the pickles, zip records, tokenizer files and the file system
_SPACE_MARGIN = 1.02


def check_target(directory: Path, need_bytes: int = 0) -> Path:
    """`directory` absent or empty, its parent writable, and `need_bytes` free there -> its absolute path.
    Anything else is a CheckpointError of one line."""
    d = Path(directory).expanduser().absolute()
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{d}: exists and is not a directory")
    if d.is_dir() and any(d.iterdir()):
        raise CheckpointError(f"{d}: not empty; give a new or empty directory (nothing is overwritten)")
    parent = d if d.is_dir() else d.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise CheckpointError(f"{d}: cannot write there ({e.strerror or e})") from None
    free = shutil.disk_usage(parent).free
    if need_bytes and free < need_bytes * _SPACE_MARGIN:
        raise CheckpointError(f"{d}: needs {need_bytes * _SPACE_MARGIN / 1e9:.2f} GB, {free / 1e9:.2f} GB free")
    return d


def state_bytes(sd: StateDict) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def write_checkpoint(directory: Path, raw_config: dict[str, Any], ranks: dict[bytes, int], specials: list[str],
                     model_sd: StateDict, codec: nn.Module, raw_codec_config: dict[str, Any] | None = None) -> Path:
    """Writes a complete model directory (see the module doc) -> its path. `model_sd` is saved as given (the
    caller picks the dtype: bf16 like the real file); the codec's weights are saved in fp32 in the file layout."""
    codec_sd = to_file_layout(codec)
    d = check_target(directory, state_bytes(model_sd) + state_bytes(codec_sd))
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.partial-", dir=d.parent))
    try:
        _write(tmp / "config.json", json.dumps(raw_config, indent=4, sort_keys=True).encode())
        _write(tmp / "tokenizer.tiktoken", tiktoken_text(ranks).encode())
        _write(tmp / "special_tokens.json", json.dumps(special_ids(ranks, specials), indent=2).encode())
        if raw_codec_config is not None:
            _write(tmp / "codec_config.json", json.dumps(raw_codec_config, indent=2).encode())
        _save(tmp / "model.pth", upstream_order({k: v.detach().cpu().contiguous() for k, v in model_sd.items()}))
        _save(tmp / "codec.pth", codec_sd)
        tmp.chmod(0o755)
        if d.is_dir():
            d.rmdir()  # empty (checked above): the rename below needs it gone
        tmp.rename(d)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return d


def write_random_checkpoint(name: str, directory: Path, device: torch.device | str = "cpu", seed: int = 0) -> Path:
    """The random checkpoint `--random-weights NAME` runs on (same generator, same seed), written as files.
    device: where the random numbers are drawn (a GPU is much faster for the real size); the files are the same
    format either way."""
    from .synthetic import load_preset, random_checkpoint, synthetic_ranks, synthetic_specials

    preset = load_preset(name)
    check_target(directory)  # fail before minutes of work; the size is checked again once known
    ckpt = random_checkpoint(name, device, torch.bfloat16, torch.float32, seed=seed)
    return write_checkpoint(directory, preset.raw_config, synthetic_ranks(preset.base_vocab),
                            synthetic_specials(preset.config.codebook_size), ckpt.model.state_dict(), ckpt.codec,
                            preset.raw_codec_config)


def tiktoken_text(ranks: dict[bytes, int]) -> str:
    """tokenizer.tiktoken: one `base64(bytes) rank` line per rank, in rank order."""
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n"
                   for token, rank in sorted(ranks.items(), key=lambda item: item[1]))


def special_ids(ranks: dict[bytes, int], specials: list[str]) -> dict[str, int]:
    """special_tokens.json: the specials numbered after the ordinary ranks, in id order."""
    return {tok: len(ranks) + i for i, tok in enumerate(specials)}


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _save(path: Path, sd: StateDict) -> None:
    # fsync: the bytes are on disk (and clean in the page cache, so a measurement can evict them)
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
