"""`python -m ttsengine info`: what a checkpoint needs before you deploy it, without loading weights.

Prints the config, parameters and bytes per part at a dtype and weight quantization, the KV cache
per position and per minute of audio, and how many KV positions fit in a memory budget. The modules
are built on the meta device; for --model DIR only the files' configs, tokenizer and tensor shapes
are read (torch files memory-mapped, safetensors headers): no GPU and no memory for the weights are
needed, and files that do not fit together get the same one-line errors as loading gives.

Bytes count weights as the engine holds them: --dtype for the DualAR and the codec (the engine's
auto dtype on CUDA is bf16 for both), --quant for the linear layers model/quant.py quantizes.
Activations, CUDA graphs and the allocator need memory beyond weights + KV cache.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..engine.loader import DTYPES
from ..errors import CheckpointError, ConfigError
from ..model.codec import Codec, CodecConfig, codec_buffer_key
from ..model.dual_ar import DualAR
from ..model.dual_ar_config import DualARConfig
from ..model.families import Family, s1
from ..model.loading.checkpoint import on_meta, read_model_dir
from ..model.loading.synthetic import load_preset
from ..model.loading.weights import load_strict, read_state_dict
from ..model.quant import quantizable
from ..model.state_dict import StateDict
from ..model.tokenizer import Tokenizer

GIB = 1 << 30
QUANTS = ("none", "int8", "int4")
INT4_GROUP = 128  # input channels per int4 scale/zero pair (quant.py's torchao group size)
# DualAR top-level module -> the part it is counted in
PART_OF = {
    "layers": "slow_transformer", "norm": "slow_transformer",
    "fast_project_in": "fast_transformer", "fast_layers": "fast_transformer", "fast_norm": "fast_transformer",
    "embeddings": "embeddings", "codebook_embeddings": "embeddings", "fast_embeddings": "embeddings",
    "output": "output_head", "fast_output": "output_head",
}
PARTS = ("slow_transformer", "fast_transformer", "embeddings", "output_head", "codec")
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


@dataclass(frozen=True)
class Described:
    """A checkpoint as info sees it: configs, tokenizer, and both modules on the meta device (for a
    model dir with the files' shapes and stored dtypes assigned)."""

    source: str
    family: Family
    config: DualARConfig
    codec_config: CodecConfig
    tokenizer: Tokenizer
    dual_ar: DualAR
    codec: Codec
    files: dict[str, Path]  # "model"/"codec" -> file read (empty for random weights)


@dataclass(frozen=True)
class Size:
    params: int
    bytes: int

    def __add__(self, other: Size) -> Size:
        return Size(self.params + other.params, self.bytes + other.bytes)


# ---- reading ------------------------------------------------------------------------------------
def from_preset(name: str) -> Described:
    p = load_preset(name)
    with on_meta():
        dual_ar = DualAR(p.config, p.tokenizer.semantic_begin_id, p.tokenizer.semantic_end_id)
        codec = Codec(p.codec_config)
    return Described(f"random weights ({name})", s1, p.config, p.codec_config, p.tokenizer, dual_ar, codec,
                     {})


def from_model_dir(model_dir: Path) -> Described:
    """The checks load_checkpoint makes, in its order, with shapes instead of tensors."""
    model_dir = Path(model_dir)
    files = read_model_dir(model_dir)
    family, cfg, tok, codec_cfg = files.family, files.config, files.tokenizer, files.codec_config
    model_path, codec_path = files.model_path, files.codec_path
    dual_ar, codec = files.meta_modules()
    load_strict(dual_ar, family.normalize_model_keys(read_shapes(model_path)), str(model_path))
    load_strict(codec, family.normalize_codec_keys(read_shapes(codec_path)), str(codec_path), codec_buffer_key)
    return Described(str(model_dir), family, cfg, codec_cfg, tok, dual_ar, codec,
                     {"model": model_path, "codec": codec_path})


def read_shapes(path: Path) -> StateDict:
    """{name: meta tensor of the stored shape and dtype} without reading tensor data: a torch file
    is memory-mapped (zip format; an old-format file is read whole), a safetensors file only has its
    header read. Meta tensors go through the same key normalisation (qkv fusing, weight-norm
    folding) and strict shape check as real ones."""
    path = Path(path)
    if path.suffix == ".safetensors":
        header = _safetensors_header(path)
        sd = {k: torch.empty(v["shape"], dtype=_SAFETENSORS_DTYPES.get(v["dtype"], torch.float32), device="meta")
              for k, v in header.items() if k != "__metadata__"}
        if not sd:
            raise CheckpointError(f"{path}: the state_dict is empty")
        return sd
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in read_state_dict(path).items()}


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then the JSON), checked
    against the file's size so that a truncated file fails here as it would when loading."""
    bad = f"{path}: not a readable safetensors file (truncated or corrupt?)"
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise CheckpointError(f"{bad}: header length {n} does not fit a file of {size} bytes")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{bad}: header is not JSON ({e})") from None
    try:
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        ok = all(isinstance(v["shape"], list) and all(isinstance(x, int) and x >= 0 for x in v["shape"])
                 for k, v in header.items() if k != "__metadata__")
    except (TypeError, KeyError, IndexError, AttributeError):
        ok, end = False, 0
    if not isinstance(header, dict) or not ok:
        raise CheckpointError(f"{bad}: header does not describe tensors")
    if 8 + n + end > size:
        raise CheckpointError(f"{bad}: tensor data ends at byte {8 + n + end}, the file has {size}")
    return header


# ---- counting -----------------------------------------------------------------------------------
def linear_weight_bytes(out_features: int, in_features: int, quant: str, dtype_bytes: int) -> int:
    """Bytes of one linear weight [out, in] as stored: int8 = one byte per weight + an fp32 scale per
    output row (quant.Int8Linear); int4 = half a byte per weight + a bf16 scale and zero per row and
    group of INT4_GROUP inputs (torchao's int4 layouts); else the dtype."""
    if quant == "int8":
        return out_features * in_features + 4 * out_features
    if quant == "int4":
        return out_features * in_features // 2 + out_features * (-(-in_features // INT4_GROUP)) * 2 * 2
    return out_features * in_features * dtype_bytes


def part_sizes(module: nn.Module, dtype: torch.dtype, quant: str, part_of=lambda name: "all") -> dict[str, Size]:
    """Parameters and bytes of `module` per part (`part_of(top-level child name)`), at `dtype` with
    the linears that quant.py would quantize in `quant` counted quantized. Buffers (RoPE tables,
    masks) are recomputed at load and not counted."""
    eligible = quantizable(quant) if quant != "none" else (lambda m: False)
    dtype_bytes = torch.empty(0, dtype=dtype).element_size()
    sizes: dict[str, Size] = {}
    for name, sub in module.named_modules():
        for pname, p in sub.named_parameters(recurse=False):
            if pname == "weight" and isinstance(sub, nn.Linear) and eligible(sub):
                nbytes = linear_weight_bytes(sub.out_features, sub.in_features, quant, dtype_bytes)
            else:
                nbytes = p.numel() * dtype_bytes
            part = part_of((name or pname).split(".")[0])
            sizes[part] = sizes.get(part, Size(0, 0)) + Size(p.numel(), nbytes)
    return sizes


def kv_bytes_per_position(cfg: DualARConfig, dtype: torch.dtype) -> int:
    """The slow transformer's K and V for one position in every layer (the fast transformer's cache
    is per stream, num_codebooks positions, and negligible)."""
    s = cfg.slow
    return s.n_layer * 2 * s.n_local_heads * s.head_dim * torch.empty(0, dtype=dtype).element_size()


def report(d: Described, dtype_name: str = "bfloat16", quant: str = "none", memory_gb: float | None = None) -> dict:
    """Everything info prints, as one JSON-able dict (bytes as integers)."""
    dtype = DTYPES[dtype_name]
    cfg, ccfg = d.config, d.codec_config
    sizes = {**part_sizes(d.dual_ar, dtype, quant, PART_OF.__getitem__),
             "codec": sum(part_sizes(d.codec, dtype, quant).values(), Size(0, 0))}
    parts = {p: sizes.get(p, Size(0, 0)) for p in PARTS}
    dual_ar = sum((parts[p] for p in PARTS[:-1]), Size(0, 0))
    total = dual_ar + parts["codec"]
    frame_rate = ccfg.sample_rate / ccfg.frame_length
    kv = kv_bytes_per_position(cfg, dtype)
    out = {
        "source": d.source, "family": d.family.NAME, "dtype": dtype_name, "quant": quant,
        "config": asdict(cfg), "codec_config": asdict(ccfg),
        "tokenizer": {"n_vocab": d.tokenizer.n_vocab, "semantic_begin_id": d.tokenizer.semantic_begin_id,
                      "semantic_end_id": d.tokenizer.semantic_end_id, "im_end_id": d.tokenizer.im_end_id},
        "dual_ar_params": dual_ar.params, "codec_params": parts["codec"].params,
        "parts": {p: {"params": parts[p].params, "bytes": parts[p].bytes} for p in PARTS},
        "dual_ar_bytes": dual_ar.bytes, "codec_bytes": parts["codec"].bytes, "weight_bytes": total.bytes,
        "frame_rate_hz": frame_rate, "max_seq_len": cfg.max_seq_len, "max_context_s": cfg.max_seq_len / frame_rate,
        "max_prompt_positions": cfg.max_seq_len - d.family.RULES.prompt_reserve,
        "kv_bytes_per_position": kv, "kv_bytes_per_stream_minute": round(kv * frame_rate * 60),
        "files": {k: {"path": str(p), "bytes": p.stat().st_size, "stored_dtypes": _stored_dtypes(
            d.dual_ar if k == "model" else d.codec)} for k, p in d.files.items()},
    }
    if memory_gb is not None:
        positions = max(0, (int(memory_gb * GIB) - total.bytes) // kv)
        out.update(memory_gb=memory_gb, kv_positions_fit=positions, stream_minutes_fit=positions / (frame_rate * 60),
                   full_context_streams_fit=positions // cfg.max_seq_len)
    return out


def _stored_dtypes(module: nn.Module) -> dict[str, int]:
    """Parameters per dtype as the file stores them (load_strict assigned the file's meta tensors)."""
    c = Counter()
    for p in module.parameters():
        c[str(p.dtype).removeprefix("torch.")] += p.numel()
    return dict(c)


# ---- printing -----------------------------------------------------------------------------------
def _b(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def human(r: dict) -> str:
    c, s, f = r["config"], r["config"]["slow"], r["config"]["fast"]
    lines = [
        f"{r['family']} checkpoint: {r['source']}",
        f"  slow: {s['n_layer']} layers, dim {s['dim']}, {s['n_head']} heads / {s['n_local_heads']} KV heads "
        f"x {s['head_dim']}, FFN {s['intermediate_size']}, q/k norm {'on' if s['qk_norm'] else 'off'}",
        f"  fast: {f['n_layer']} layers, dim {f['dim']}, {f['n_head']} heads / {f['n_local_heads']} KV heads "
        f"x {f['head_dim']}, FFN {f['intermediate_size']}, q/k norm {'on' if f['qk_norm'] else 'off'}",
        f"  vocab {c['vocab_size']} ({r['tokenizer']['n_vocab']} used), {c['num_codebooks']} codebooks x "
        f"{c['codebook_size']}, scaled codebook embeddings {'on' if c['scale_codebook_embeddings'] else 'off'}, "
        f"tied output {'yes' if c['tie_word_embeddings'] else 'no'}",
    ]
    for kind, file in r["files"].items():
        stored = ", ".join(f"{k} {v:,}" for k, v in file["stored_dtypes"].items())
        lines.append(f"  {kind} file: {file['path']} ({_b(file['bytes'])}; params stored as {stored})")
    lines += ["", f"weights at {r['dtype']}, quantization {r['quant']}:", f"  {'part':<18}{'params':>15}{'bytes':>13}"]
    rows = [(p.replace("_", " "), r["parts"][p]) for p in PARTS[:-1]]
    rows += [("DualAR total", {"params": r["dual_ar_params"], "bytes": r["dual_ar_bytes"]}),
             ("codec", r["parts"]["codec"]),
             ("total", {"params": r["dual_ar_params"] + r["codec_params"], "bytes": r["weight_bytes"]})]
    lines += [f"  {name:<18}{v['params']:>15,}{_b(v['bytes']):>13}" for name, v in rows]
    lines += [
        "",
        f"frame rate      {r['frame_rate_hz']:.2f} frames/s ({r['codec_config']['sample_rate']} Hz / "
        f"{r['codec_config']['sample_rate'] / r['frame_rate_hz']:.0f} samples)",
        f"max context     {r['max_seq_len']} positions ({r['max_context_s']:.1f} s of audio; prompts up to "
        f"{r['max_prompt_positions']})",
        f"KV cache        {_b(r['kv_bytes_per_position'])} per position, {_b(r['kv_bytes_per_stream_minute'])} "
        f"per stream-minute",
    ]
    if "memory_gb" in r:
        budget = f"in {r['memory_gb']:g} GiB"
        lines.append(f"{budget:<16}{r['kv_positions_fit']:,} KV positions after weights "
                     f"({r['stream_minutes_fit']:.1f} stream-minutes, {r['full_context_streams_fit']} streams at "
                     "full context; activations and graphs need some of it)")
    if r["quant"] == "int4":
        lines.append("int4 needs a CUDA device and torchao")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine info", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="model dir (config.json, tokenizer, model and codec files)")
    src.add_argument("--random-weights", metavar="NAME", help="a built-in config with random weights: s1-mini")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="weight dtype (default bfloat16)")
    ap.add_argument("--quant", choices=QUANTS, default="none", help="weight-only quantization of linear layers")
    ap.add_argument("--memory-gb", type=float, help="GPU memory in GiB: how many KV positions fit after weights")
    args = ap.parse_args(argv)
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise ConfigError(f"--memory-gb must be > 0, got {args.memory_gb}")
    d = from_model_dir(args.model) if args.model else from_preset(args.random_weights)
    r = report(d, args.dtype, args.quant, args.memory_gb)
    print(json.dumps(r) if args.json else human(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
