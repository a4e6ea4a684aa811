"""`python -m infra.sagemaker.ecr --repository fish-tts-server [--tag TAG] [--region R] [--no-build]`

Builds the image, creates the ECR repository when missing, logs docker in with an ECR token, tags and pushes;
prints the image URI to pass to `python -m infra.sagemaker.deploy deploy --image`.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class EcrError(Exception):
    pass


def repository_uri(ecr, name: str) -> str:
    """The repository's URI, creating the repository if needed (idempotent)."""
    try:
        return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]["repositoryUri"]
    except ecr.exceptions.RepositoryNotFoundException:
        return ecr.create_repository(repositoryName=name, imageScanningConfiguration={"scanOnPush": True},
                                     )["repository"]["repositoryUri"]


def credentials(ecr) -> tuple[str, str, str]:
    """-> (registry host, user, password) for `docker login`."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    return data["proxyEndpoint"].removeprefix("https://"), user, password


def _docker(*args: str, stdin: str | None = None) -> None:
    proc = subprocess.run(["docker", *args], input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise EcrError(f"docker {args[0]} failed: {last[0]}")


def publish(ecr, repository: str, tag: str, build: bool = True, base_image: str | None = None) -> str:
    uri = repository_uri(ecr, repository)
    local = f"{repository}:{tag}"
    if build:
        _docker("build", "-t", local, *(["--build-arg", f"BASE_IMAGE={base_image}"] if base_image else []), str(ROOT))
    registry, user, password = credentials(ecr)
    _docker("login", "--username", user, "--password-stdin", registry, stdin=password)
    _docker("tag", local, f"{uri}:{tag}")
    _docker("push", f"{uri}:{tag}")
    return f"{uri}:{tag}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.sagemaker.ecr", description=__doc__.splitlines()[0])
    ap.add_argument("--repository", required=True)
    ap.add_argument("--tag", default="latest")
    ap.add_argument("--region")
    ap.add_argument("--no-build", action="store_true", help="push an image already built as REPOSITORY:TAG")
    args = ap.parse_args(argv)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        ecr = boto3.client("ecr", region_name=args.region)
        print(publish(ecr, args.repository, args.tag, not args.no_build, os.environ.get("BASE_IMAGE")))
    except (EcrError, BotoCoreError, ClientError) as e:
        print(f"ecr: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError:
        print("ecr: docker is not installed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
