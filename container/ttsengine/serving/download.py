"""Fetching a model directory from the Hugging Face Hub, S3, a local directory or the bundled tiny test model,
then checking it is complete.

A directory this module fills records where it came from (PROVENANCE: the source, and the Hub commit or the S3
ETag where known), so `ensure_model` can tell a model fetched from another source from the one asked for: a
changed TTS_MODEL_SOURCE is fetched into a fresh sibling directory and TTS_MODEL_DIR, a symlink, is switched to it
in one rename. huggingface_hub and boto3 are imported only when used (extra `download`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError, DownloadError

log = logging.getLogger(__name__)

REQUIRED = ("config.json", "tokenizer.tiktoken", "special_tokens.json")
ONE_OF = (("model.pth", "model.safetensors"), ("codec.pth", "codec.safetensors"))
HF_PATTERNS = [*REQUIRED, "model.pth", "model.safetensors", "codec.pth", "codec.safetensors", "codec_config.json"]
PROVENANCE = ".tts-source.json"  # {"source", "revision" (Hub commit), "etag" (S3 tarball), "fetched_at"}
TINY = "tiny"  # TTS_MODEL_SOURCE=tiny: the tiny random test model, for trying the server without the gated weights
# where the tiny model is: the image's copy (Dockerfile), else the repository's (an editable install, no Docker)
TINY_MAX_NEW_TOKENS = 64  # the tiny model never ends a sentence: 1024 frames of noise (~47 s) unless capped
TINY_DIRS = (Path("/opt/tts/tiny-model"),
             Path(__file__).resolve().parents[3] / "tests" / "assets" / "golden" / "checkpoint")


def verify_model_dir(path: Path) -> None:
    """Raises CheckpointError naming every missing file."""
    path = Path(path)
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    missing += [" or ".join(names) for names in ONE_OF if not any((path / n).is_file() for n in names)]
    if missing:
        what = "model directory is incomplete" if path.is_dir() else "model directory not found"
        raise CheckpointError(f"{path}: {what}, missing: {', '.join(missing)}")


def is_tiny(model_dir: Path) -> bool:
    """model_dir holds the tiny test model: installed by TTS_MODEL_SOURCE=tiny, or a copy of it (same config.json),
    also one fetched from another source (a copy under ./models given as /host-models/NAME)."""
    record = read_provenance(model_dir)
    if record is not None and record["source"] == TINY:
        return True
    try:
        return (Path(model_dir) / "config.json").read_bytes() == (tiny_model_dir() / "config.json").read_bytes()
    except (OSError, DownloadError):
        return False


def default_max_new_tokens(model_dir: Path, configured: int) -> int:
    """TTS_DEFAULT_MAX_NEW_TOKENS as configured, except 0 (auto) on the tiny test model: TINY_MAX_NEW_TOKENS."""
    return TINY_MAX_NEW_TOKENS if configured == 0 and is_tiny(model_dir) else configured


def download_hf(repo_id: str, dest: Path, token: str | None = None, revision: str | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    dest = Path(dest)
    try:
        snapshot_download(repo_id, revision=revision, local_dir=str(dest), token=token or None,
                          allow_patterns=HF_PATTERNS)
    except GatedRepoError:
        raise DownloadError(f"hf://{repo_id}: the repository is gated; accept its licence on huggingface.co "
                            "and set HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"hf://{repo_id}: repository not found (or HF_TOKEN lacks access to it)") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"hf://{repo_id}: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise DownloadError(f"hf://{repo_id}: {e}") from None
    verify_model_dir(dest)
    return dest


def _hf_commit(dest: Path) -> str | None:
    """The Hub commit snapshot_download fetched, from the metadata it keeps beside a local_dir download."""
    for meta in sorted((Path(dest) / ".cache" / "huggingface" / "download").glob("*.metadata")):
        try:
            first = meta.read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            continue
        if re.fullmatch(r"[0-9a-f]{40}", first):
            return first
    return None


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise DownloadError(f"{uri}: not an s3://bucket/key URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise DownloadError(f"{uri}: no bucket name")
    return bucket, key


def _safe_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            p = PurePosixPath(member.name)
            if p.is_absolute() or ".." in p.parts or member.issym() or member.islnk() or member.isdev():
                raise DownloadError(f"{archive.name}: refusing unsafe archive member {member.name!r}")
        tar.extractall(dest)  # every member checked above: regular files and directories inside dest


def _flatten_single_dir(dest: Path) -> None:
    # A model.tar.gz made from a folder holds that folder; SageMaker expects the files at the top.
    entries = [p for p in dest.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and not (dest / "config.json").exists():
        inner = entries[0]
        for child in inner.iterdir():
            shutil.move(str(child), dest / child.name)
        inner.rmdir()


def download_s3(uri: str, dest: Path) -> Path:
    """s3://bucket/prefix (every object under it) or s3://bucket/path/model.tar.gz (unpacked, its ETag kept in
    dest/.s3-etag for the provenance record)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    from tqdm import tqdm

    bucket, key = _split_s3(uri)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    s3 = boto3.client("s3")
    try:
        if key.endswith((".tar.gz", ".tgz")):
            head = s3.head_object(Bucket=bucket, Key=key)
            size = head["ContentLength"]
            with tempfile.TemporaryDirectory() as tmp, tqdm(total=size, unit="B", unit_scale=True, desc=key) as bar:
                archive = Path(tmp) / "model.tar.gz"
                s3.download_file(bucket, key, str(archive), Callback=bar.update)
                _safe_extract(archive, dest)
            _flatten_single_dir(dest)
            (dest / ".s3-etag").write_text(str(head.get("ETag", "")).strip('"'))
        else:
            prefix = key.rstrip("/") + "/" if key else ""
            objects = [o for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                       for o in page.get("Contents", []) if not o["Key"].endswith("/")]
            if not objects:
                raise DownloadError(f"{uri}: no objects under this prefix")
            with tqdm(total=sum(o["Size"] for o in objects), unit="B", unit_scale=True, desc=uri) as bar:
                for o in objects:
                    rel = PurePosixPath(o["Key"][len(prefix):])
                    if ".." in rel.parts:
                        raise DownloadError(f"{uri}: refusing object key {o['Key']!r}")
                    target = dest.joinpath(*rel.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    s3.download_file(bucket, o["Key"], str(target), Callback=bar.update)
    except NoCredentialsError:
        raise DownloadError(f"{uri}: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                            "AWS_PROFILE or an instance role)") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise DownloadError(f"{uri}: {err.get('Code', 'error')}: {err.get('Message', str(e))}") from None
    except (BotoCoreError, tarfile.TarError, OSError) as e:
        raise DownloadError(f"{uri}: {e}") from None
    verify_model_dir(dest)
    return dest


def tiny_model_dir() -> Path:
    for d in TINY_DIRS:
        if (d / "config.json").is_file():
            return d
    raise DownloadError(f"TTS_MODEL_SOURCE=tiny: the tiny test model is not in {' or '.join(map(str, TINY_DIRS))}")


def fetch(source: str, dest: Path, token: str | None = None) -> Path:
    """source: hf://owner/name[@revision], s3://bucket/prefix-or-tarball, a local model directory, or `tiny`."""
    if source.startswith("hf://"):
        repo, _, revision = source[5:].partition("@")
        return download_hf(repo, dest, token=token, revision=revision or None)
    if source.startswith("s3://"):
        return download_s3(source, dest)
    local = tiny_model_dir() if source == TINY else Path(source)
    if not local.is_dir():
        raise DownloadError(f"TTS_MODEL_SOURCE={source!r}: not hf://..., s3://..., tiny or an existing directory")
    verify_model_dir(local)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(local, dest, dirs_exist_ok=True)
    if not (dest / "codec_config.json").is_file() and (local.parent / "codec_config.json").is_file():
        shutil.copy(local.parent / "codec_config.json", dest)  # a golden set's checkpoint/ (codec config one up)
    return dest


def read_provenance(model_dir: Path) -> dict | None:
    """What PROVENANCE says filled model_dir; None when it has no (readable) record."""
    try:
        record = json.loads((Path(model_dir) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("source"), str) else None


def model_origin(model_dir: Path) -> dict:
    """What /ready reports about the model served: its directory and, from PROVENANCE, the source it was fetched
    from with the Hub revision or S3 ETag (source None: put there by hand or by SageMaker, no record)."""
    record = read_provenance(model_dir) or {}
    return {"dir": str(model_dir), "source": record.get("source"),
            **{k: record[k] for k in ("revision", "etag", "fetched_at") if record.get(k)}}


def _same_source(a: str, b: str) -> bool:
    def norm(s: str) -> str:
        s = s.strip()
        if "://" in s or s == TINY:
            return s.rstrip("/")
        return str(Path(s).expanduser().resolve())
    return norm(a) == norm(b)


def _write_provenance(dest: Path, source: str) -> None:
    record: dict = {"source": source, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if source.startswith("hf://"):
        record["revision"] = _hf_commit(dest)
    etag = dest / ".s3-etag"
    if etag.is_file():
        record["etag"] = etag.read_text() or None
        etag.unlink()
    tmp = dest / (PROVENANCE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, dest / PROVENANCE)


def _fresh_name(model_dir: Path, source: str) -> Path:
    """A sibling of model_dir named after the source: current.hf-fishaudio-openaudio-s1-mini-1a2b3c4d."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", source.split("://", 1)[-1]).strip("-.")[-40:]
    scheme = source.split("://", 1)[0] + "-" if "://" in source else ""
    digest = hashlib.sha256(source.encode()).hexdigest()[:8]
    return model_dir.with_name(f"{model_dir.name}.{scheme}{tail}-{digest}")


def _switch(model_dir: Path, fresh: Path) -> None:
    """Point model_dir at fresh: model_dir becomes a relative symlink (it resolves wherever the volume is mounted),
    replaced in one rename; the directory it pointed to before is removed afterwards."""
    old_target = model_dir.resolve() if model_dir.is_symlink() else None
    if model_dir.exists() and not model_dir.is_symlink():
        aside = model_dir.with_name(f"{model_dir.name}.replaced")
        shutil.rmtree(aside, ignore_errors=True)
        model_dir.rename(aside)  # a real directory (an older version's fetch): set aside, removed below
        old_target = aside
    link = model_dir.with_name(f".{model_dir.name}.link")
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(fresh.name)
    os.replace(link, model_dir)
    if old_target is not None and old_target != fresh.resolve() and old_target.parent == model_dir.parent.resolve():
        shutil.rmtree(old_target, ignore_errors=True)


def ensure_model(model_dir: Path, source: str | None, token: str | None = None) -> Path:
    """model_dir as it is when it is complete and holds `source` (or no source is given); otherwise `source` is
    fetched into a fresh sibling directory (via a .partial one, so an interrupted download is never mistaken for a
    model), its provenance recorded, and model_dir switched to it. A complete model_dir with no record of its
    source (put there by hand, by SageMaker, or by a version before the record) is served as it is, with a warning
    saying how to replace it."""
    model_dir = Path(model_dir)
    try:
        verify_model_dir(model_dir)
        complete = True
    except CheckpointError:
        if not source:
            raise
        complete = False
    if complete:
        if not source:
            return model_dir
        record = read_provenance(model_dir)
        if record is None:
            log.warning("%s holds a model with no record of its source; serving it, not %s. To fetch that "
                        "instead, empty %s (compose: docker compose down && docker volume rm fish-tts_models)",
                        model_dir, source, model_dir)
            return model_dir
        if _same_source(record["source"], source):
            return model_dir
        log.info("%s holds %s; fetching %s into a fresh directory", model_dir, record["source"], source)
    else:
        log.info("model not found in %s: fetching %s", model_dir, source)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    fresh = _fresh_name(model_dir, source)
    if fresh.exists() and fresh.resolve() == model_dir.resolve():  # the same source, left incomplete: fetch anew
        fresh = fresh.with_name(fresh.name + "-" + str(int(time.time())))
    partial = fresh.with_name(fresh.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    fetch(source, partial, token)
    _write_provenance(partial, source)
    shutil.rmtree(fresh, ignore_errors=True)
    partial.rename(fresh)
    _switch(model_dir, fresh)
    return model_dir
