"""Fetching a model directory from the Hugging Face Hub or S3, then checking it is complete.

huggingface_hub and boto3 are imported only when used (extra `download`).
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from ..errors import CheckpointError, DownloadError

log = logging.getLogger(__name__)

REQUIRED = ("config.json", "tokenizer.tiktoken", "special_tokens.json")
ONE_OF = (("model.pth", "model.safetensors"), ("codec.pth", "codec.safetensors"))
HF_PATTERNS = [*REQUIRED, "model.pth", "model.safetensors", "codec.pth", "codec.safetensors", "codec_config.json"]


def verify_model_dir(path: Path) -> None:
    """Raises CheckpointError naming every missing file."""
    path = Path(path)
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    missing += [" or ".join(names) for names in ONE_OF if not any((path / n).is_file() for n in names)]
    if missing:
        raise CheckpointError(f"{path}: model directory is incomplete, missing: {', '.join(missing)}")


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
    """s3://bucket/prefix (every object under it) or s3://bucket/path/model.tar.gz (unpacked)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    from tqdm import tqdm

    bucket, key = _split_s3(uri)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    s3 = boto3.client("s3")
    try:
        if key.endswith((".tar.gz", ".tgz")):
            size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
            with tempfile.TemporaryDirectory() as tmp, tqdm(total=size, unit="B", unit_scale=True, desc=key) as bar:
                archive = Path(tmp) / "model.tar.gz"
                s3.download_file(bucket, key, str(archive), Callback=bar.update)
                _safe_extract(archive, dest)
            _flatten_single_dir(dest)
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


def fetch(source: str, dest: Path, token: str | None = None) -> Path:
    """source: hf://owner/name[@revision], s3://bucket/prefix-or-tarball, or a local model directory."""
    if source.startswith("hf://"):
        repo, _, revision = source[5:].partition("@")
        return download_hf(repo, dest, token=token, revision=revision or None)
    if source.startswith("s3://"):
        return download_s3(source, dest)
    local = Path(source)
    if not local.is_dir():
        raise DownloadError(f"TTS_MODEL_SOURCE={source!r}: not hf://..., s3://... or an existing directory")
    verify_model_dir(local)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(local, dest, dirs_exist_ok=True)
    return dest


def ensure_model(model_dir: Path, source: str | None, token: str | None = None) -> Path:
    """A complete model_dir as it is; otherwise fetched once from `source` (a volume keeps it for the next
    start). Fetches into a temporary sibling and renames, so an interrupted download is never mistaken
    for a model."""
    model_dir = Path(model_dir)
    try:
        verify_model_dir(model_dir)
        return model_dir
    except CheckpointError:
        if not source:
            raise
    log.info("model not found in %s: fetching %s", model_dir, source)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = model_dir.with_name(model_dir.name + ".partial")
    fetch(source, partial, token)
    if model_dir.exists():
        shutil.rmtree(model_dir)
    partial.rename(model_dir)
    return model_dir

