"""`python -m infra.sagemaker.package --model DIR --out model.tar.gz [--code] [--cache-blob FILE] [--codec-cache FILE]`

Builds the model.tar.gz SageMaker unpacks into /opt/ml/model: the model files at the top, stored
voices (voices/) if the model dir has them, optionally the kernel-cache blob (kernel-cache/, point
TTS_CACHE_DIR there) and the codec converted to bf16 (kernel-cache/weights/codec-KEY.pt, from the cache
directory of a `warm` run in the serving image: its key holds the torch version, so an entry made elsewhere
is simply not found), so a new instance neither compiles nor converts the codec; and, with --code, the
script-mode code/ for AWS's PyTorch inference containers:
code/inference.py (handlers/sagemaker/inference.py, unchanged), code/ttsengine/ (the engine) and
code/requirements.txt (our dependencies, minus torch and numpy, which the container provides).
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import tarfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = ("config.json", "model.pth", "model.safetensors", "tokenizer.tiktoken", "special_tokens.json",
               "codec.pth", "codec.safetensors", "codec_config.json")
CONTAINER_PROVIDES = ("torch", "numpy")


def requirements() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    keep = [d for d in deps if d.split(">")[0].split("=")[0].split("<")[0].strip().lower() not in CONTAINER_PROVIDES]
    return "\n".join(keep) + "\n"


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def build(model_dir: Path, out: Path, code: bool = False, cache_blob: Path | None = None,
          codec_cache: Path | None = None) -> list[str]:
    """-> the archive's member names."""
    model_dir = Path(model_dir)
    files = [model_dir / name for name in MODEL_FILES if (model_dir / name).is_file()]
    names = {f.name for f in files}
    missing = [n for n in ("config.json", "tokenizer.tiktoken", "special_tokens.json") if n not in names]
    if not names & {"model.pth", "model.safetensors"}:
        missing.append("model.pth or model.safetensors")
    if not names & {"codec.pth", "codec.safetensors"}:
        missing.append("codec.pth or codec.safetensors")
    if missing:
        raise SystemExit(f"package: {model_dir}: missing {', '.join(missing)}")
    if not (model_dir / "codec_config.json").is_file() and (model_dir.parent / "codec_config.json").is_file():
        files.append(model_dir.parent / "codec_config.json")  # the golden test-set layout
    out.parent.mkdir(parents=True, exist_ok=True)
    # reproducible: the same inputs give the same bytes (deploy uploads once per content hash)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for f in files:
            tar.add(f, arcname=f.name, filter=_normalized)
        voices = model_dir / "voices"
        if voices.is_dir():
            tar.add(voices, arcname="voices", filter=_normalized)
        if cache_blob is not None:
            tar.add(cache_blob, arcname=f"kernel-cache/{Path(cache_blob).name}", filter=_normalized)
        if codec_cache is not None:
            tar.add(codec_cache, arcname=f"kernel-cache/weights/{Path(codec_cache).name}", filter=_normalized)
        if code:
            tar.add(ROOT / "handlers" / "sagemaker" / "inference.py", arcname="code/inference.py", filter=_normalized)
            tar.add(ROOT / "container" / "ttsengine", arcname="code/ttsengine",
                    filter=lambda t: None if "__pycache__" in t.name else _normalized(t))
            _add_bytes(tar, "code/requirements.txt", requirements().encode())
    with tarfile.open(out) as tar:
        return tar.getnames()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.sagemaker.package", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="model dir (config.json, model.pth, ...)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--code", action="store_true", help="add code/ for AWS's PyTorch containers (script mode)")
    ap.add_argument("--cache-blob", type=Path, help="kernel-cache blob from `python -m ttsengine warm`")
    ap.add_argument("--codec-cache", type=Path, help="weights/codec-KEY.pt from the cache dir of the same warm run")
    args = ap.parse_args(argv)
    if args.cache_blob is not None and not args.cache_blob.is_file():
        raise SystemExit(f"package: --cache-blob {args.cache_blob}: not a file")
    if args.codec_cache is not None and not (args.codec_cache.is_file() and args.codec_cache.name.startswith("codec-")
                                             and args.codec_cache.suffix == ".pt"):
        raise SystemExit(f"package: --codec-cache {args.codec_cache}: not a codec cache entry (weights/codec-KEY.pt)")
    names = build(args.model, args.out, args.code, args.cache_blob, args.codec_cache)
    print(f"wrote {args.out}: {len(names)} entries, {args.out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
