"""`python -m infra.kubernetes.render [DIR] [--image REPOSITORY[:TAG]]`

Renders a kustomization directory (default infra/kubernetes/base) to one YAML stream on stdout, for
`kubectl apply -f -`, without kustomize (which is not on PyPI: CI renders with this). It reads the subset of
Kustomize these manifests use, and refuses any other key rather than render differently from kustomize:
- resources: files, or directories with their own kustomization.yaml (an overlay's base), in order;
- namespace: set on every namespaced object;
- images: a container image whose name matches gets newName and/or newTag;
- patches: `path` (or inline `patch`) of a partial object, merged onto the object of the same kind and name
  the way a strategic-merge patch merges these manifests: maps key by key, lists of named items (containers,
  env, volumes, ports) by name, other lists replaced.
--image applies last, as `kustomize edit set image` would. The namespace is also in the ScaledObject's
Prometheus query: an overlay that changes one patches the other (tests/infra/test_kubernetes.py checks).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

BASE = Path(__file__).with_name("base")
KNOWN = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding",
                  "CustomResourceDefinition", "PriorityClass"}


class RenderError(Exception):
    pass


def _read_yaml(path: Path) -> list[dict]:
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{path}: {e}") from None


def render(directory: Path) -> list[dict]:
    """The objects of the kustomization in `directory`, transformed as kustomize would."""
    directory = Path(directory)
    (k,) = _read_yaml(directory / "kustomization.yaml") or [{}]
    unknown = set(k) - KNOWN
    if unknown:
        raise RenderError(f"{directory}/kustomization.yaml: {', '.join(sorted(unknown))} not supported here "
                          f"(supported: {', '.join(sorted(KNOWN))})")
    objects: list[dict] = []
    for entry in k.get("resources", []):
        path = directory / entry
        objects += render(path) if path.is_dir() else _read_yaml(path)
    for p in k.get("patches", []):
        if set(p) - {"path", "patch"}:
            raise RenderError(f"{directory}: patches support path or patch only (no target, no JSON 6902): {p}")
        docs = _read_yaml(directory / p["path"]) if "path" in p else [yaml.safe_load(p["patch"])]
        for doc in docs:
            apply_patch(objects, doc)
    for image in k.get("images", []):
        set_image(objects, image)
    if "namespace" in k:
        set_namespace(objects, k["namespace"])
    return objects


def _key(obj: dict) -> tuple[str, str]:
    return obj.get("kind", ""), obj.get("metadata", {}).get("name", "")


def apply_patch(objects: list[dict], patch: dict) -> None:
    target = next((o for o in objects if _key(o) == _key(patch)), None)
    if target is None:
        raise RenderError(f"patch for {'/'.join(_key(patch))}: no such object in the resources")
    merged = merge(target, patch)
    target.clear()
    target.update(merged)


def merge(base, patch):
    """A strategic merge for these manifests: dicts by key (None deletes), lists of named dicts by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = [copy.deepcopy(item) for item in base]
        for item in patch:
            at = next((i for i, b in enumerate(out) if b["name"] == item["name"]), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = merge(out[at], item)
        return out
    return copy.deepcopy(patch)


def _named(items: list) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _containers(obj: dict):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def set_image(objects: list[dict], image: dict) -> None:
    for obj in objects:
        for c in _containers(obj):
            name, _, tag = c["image"].partition(":")
            if name == image["name"]:
                c["image"] = image.get("newName", name) + (
                    f":{image['newTag']}" if "newTag" in image else (f":{tag}" if tag else ""))


def set_namespace(objects: list[dict], namespace: str) -> None:
    for obj in objects:
        if obj.get("kind") not in CLUSTER_SCOPED:
            obj.setdefault("metadata", {})["namespace"] = namespace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.kubernetes.render", description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", type=Path, default=BASE)
    ap.add_argument("--image", help="REPOSITORY[:TAG] for the fish-tts-server image")
    args = ap.parse_args(argv)
    try:
        objects = render(args.directory)
    except RenderError as e:
        print(f"render: {e}", file=sys.stderr)
        return 1
    if args.image:
        repo, _, tag = args.image.rpartition(":") if ":" in args.image.rsplit("/", 1)[-1] else (args.image, "", "")
        for obj in objects:
            for c in _containers(obj):
                c["image"] = f"{repo}:{tag}" if tag else repo
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
