"""A loaded model directory: family, config, tokenizer, DualAR and codec, checked against each other."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from ...errors import CheckpointError, ConfigError
from ..codec import Codec, CodecConfig, codec_buffer_key, load_codec_config
from ..dual_ar import DualAR
from ..dual_ar_config import DualARConfig
from ..families import Family, detect
from ..tokenizer import Tokenizer
from .codec_cache import CodecCache
from .readahead import Readahead, first_file
from .upload import to_device
from .weights import check_strict, read_state_dict


@dataclass
class Checkpoint:
    model_dir: Path
    family: Family
    config: DualARConfig
    codec_config: CodecConfig
    tokenizer: Tokenizer
    model: DualAR
    codec: Codec
    quantization: str = "bf16 (none)"
    codec_cache: str = "off"  # what the codec cache did: off | hit | miss | damaged (codec_cache.py)
    # seconds of each part of load_checkpoint, as the host saw them: files (configs, tokenizer, empty modules),
    # compiler (torch._dynamo's import, with feature lazy_compiler off), model and codec (each read, checked and copied
    # to its device); empty for random weights
    load_phases: dict[str, float] = field(default_factory=dict)


def find_weights_file(model_dir: Path, names: tuple[str, ...]) -> Path:
    found = first_file(model_dir, names)
    if found is None:
        raise CheckpointError(f"{model_dir}: none of {', '.join(names)} found")
    return found


def check_consistency(cfg: DualARConfig, tok: Tokenizer, codec_cfg: CodecConfig, model_dir: Path) -> None:
    where = f"{model_dir}/config.json"
    if cfg.vocab_size < tok.n_vocab:
        raise ConfigError(f"{where}: key 'vocab_size' is {cfg.vocab_size} but the tokenizer has {tok.n_vocab} ids")
    if tok.num_semantic > cfg.codebook_size:
        raise ConfigError(f"{where}: key 'codebook_size' is {cfg.codebook_size} but the tokenizer has "
                          f"{tok.num_semantic} semantic tokens")
    if codec_cfg.num_codebooks != cfg.num_codebooks:
        raise ConfigError(f"{where}: key 'num_codebooks' is {cfg.num_codebooks} but the codec has "
                          f"{codec_cfg.num_codebooks} codebooks")
    if codec_cfg.semantic_codebook_size != tok.num_semantic:
        raise ConfigError(f"{model_dir}: the codec's semantic codebook has {codec_cfg.semantic_codebook_size} "
                          f"entries but the tokenizer has {tok.num_semantic} semantic tokens")


@dataclass(frozen=True)
class ModelFiles:
    """A model directory's configs and tokenizer, checked against each other, and where its weights are."""

    family: Family
    config: DualARConfig
    tokenizer: Tokenizer
    codec_config: CodecConfig
    model_path: Path
    codec_path: Path

    def meta_modules(self) -> tuple[DualAR, Codec]:
        """The model and codec these files describe, on the meta device (no memory): what loading fills and
        what info checks shapes against."""
        with on_meta():
            return (DualAR(self.config, self.tokenizer.semantic_begin_id, self.tokenizer.semantic_end_id),
                    Codec(self.codec_config))


FILLS = frozenset({"normal_", "uniform_", "fill_", "zero_", "random_"})  # what nn.init writes into new parameters


class _NoFill(TorchFunctionMode):
    """Meta tensors hold no values, so filling them is skipped. Why: on the meta device nn.Embedding's normal_ runs
    torch's reference decomposition, whose first call imports torch._dynamo: ~1 s hidden in the load's 'files' phase
    (stop 58). Nothing else on a start's path imports it now (compat.compiling: eager calls skip our custom ops'
    wrappers; the compile units import it at their first compile)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in FILLS:  # Tensor.normal_(...) or nn.init.normal_(tensor=...)
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta():
    """Modules built inside have their parameters on the meta device (shapes, no memory, nothing filled)."""
    with torch.device("meta"), _NoFill():
        yield


def read_model_dir(model_dir: Path) -> ModelFiles:
    """Everything load_checkpoint checks before it reads a weight (info runs the same checks on shapes)."""
    model_dir = Path(model_dir)
    family = detect(model_dir)
    for name in family.REQUIRED_FILES:
        if not (model_dir / name).is_file():
            raise CheckpointError(f"{model_dir}: required file {name} is missing")
    cfg = family.load_config(model_dir)
    tok = family.load_tokenizer(model_dir)
    codec_cfg = load_codec_config(model_dir)
    check_consistency(cfg, tok, codec_cfg, model_dir)
    return ModelFiles(family, cfg, tok, codec_cfg, find_weights_file(model_dir, family.MODEL_FILES),
                      find_weights_file(model_dir, family.CODEC_FILES))


def load_checkpoint(model_dir: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    codec_dtype: torch.dtype = torch.float32, codec_device: torch.device | str | None = None,
                    codec_cache: CodecCache | None = None, import_compiler: bool = False) -> Checkpoint:
    """codec_device: where the codec goes (None: `device`). codec_cache: where the codec converted to
    `codec_dtype` is kept (None: read and convert codec.pth every time). import_compiler: torch._dynamo imported
    here, in a phase of its own (feature lazy_compiler off; on, nothing on a start's path to its first audio imports
    it: the first compile does).

    The weight files are read ahead in the background from the start (readahead.py), the configs and tokenizer
    are read meanwhile, and each state dict goes to its device through the staged copy (upload.py)."""
    model_dir = Path(model_dir)
    codec_device = device if codec_device is None else codec_device
    ahead = Readahead(_weight_files(model_dir, codec_cache, codec_dtype))
    phases, t = {}, time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases[name], t = round(now - t, 3), now

    try:
        files = read_model_dir(model_dir)
        family, cfg, tok, codec_cfg = files.family, files.config, files.tokenizer, files.codec_config
        model_path, codec_path = files.model_path, files.codec_path
        model, codec = files.meta_modules()
        phase("files")
        if import_compiler:  # ~1 s (stop 58: it had come with the empty modules until on_meta)
            import torch._dynamo  # noqa: F401
            phase("compiler")
        sd = check_strict(model, family.normalize_model_keys(read_state_dict(model_path)), str(model_path))
        model.load_state_dict(to_device(sd, device, lambda t: dtype), strict=True, assign=True)
        del sd  # the file's mapping goes with it
        model = model.to(device=device, dtype=dtype).eval()
        model.init_buffers()
        phase("model")
        sd = _codec_state(codec, family, codec_path, codec_dtype, codec_cache)
        codec.load_state_dict(to_device(sd, codec_device, lambda t: codec_dtype), strict=True, assign=True)
        del sd
        codec = codec.to(device=codec_device, dtype=codec_dtype).eval()
        phase("codec")
    finally:
        ahead.stop()
    return Checkpoint(model_dir, family, cfg, codec_cfg, tok, model, codec,
                      codec_cache=codec_cache.status if codec_cache is not None else "off", load_phases=phases)


def _codec_state(codec: Codec, family: Family, path: Path, dtype: torch.dtype, cache: CodecCache | None):
    """The codec's state dict, checked against the module: the cache's entry when it has a sound one, else the
    file's (folded; converted to `dtype` and cached when there is a cache)."""
    expected = codec.state_dict()
    sd = cache.read(path, dtype, expected) if cache is not None else None
    if sd is None:
        sd = family.normalize_codec_keys(read_state_dict(path))
        if cache is not None:
            sd = cache.convert(sd, path, dtype, expected)
    return check_strict(codec, sd, str(path), codec_buffer_key)


def _weight_files(model_dir: Path, cache: CodecCache | None, codec_dtype: torch.dtype) -> list[Path]:
    """The files the load will read: model weights, and the codec's cache entry if there is one, else its file.
    Problems are left for read_model_dir to report in its words."""
    try:
        family = detect(model_dir)
        model_path = find_weights_file(model_dir, family.MODEL_FILES)
        codec_path = find_weights_file(model_dir, family.CODEC_FILES)
        if cache is not None:
            entry = cache.entry(codec_path, codec_dtype)[0]
            codec_path = entry if entry.is_file() else codec_path
    except (CheckpointError, ConfigError, OSError):
        return []
    return [model_path, codec_path]
