"""`python -m infra.runpod.deploy [--spec FILE] [--image IMAGE] [--volume ID] [--env K=V] [--dry-run]`

Creates or updates a RunPod serverless endpoint with the runpod SDK's API functions (RUNPOD_API_KEY).
Idempotent: the template's name carries a hash of image, start command, disk and env, so an unchanged spec
reuses the template; a changed one gets a new template and the endpoint is switched to it
(update_endpoint_template); scaling settings that differ are saved on the existing endpoint.
The spec is checked before any call: request-count scaling must not count a worker for more jobs than the
smallest GPU pool's worker takes (infra/runpod/pools.py; scalerValue "auto", the shipped value, is TARGET_SHARE of
them, so new workers start while the running ones still have room), and a template that keeps its files on
/runpod-volume needs a network volume (--volume). --dry-run prints the template and endpoint it would save
and calls nothing (no key needed). Every field: docs/deploy-runpod.md.
With a network volume (--volume), the worker keeps the model and the kernel cache on it. With an hf:// model
source, HF_TOKEN is taken from the environment into the template's env (unless --env or the spec sets it: the
shipped endpoint.json refers to a RunPod secret): the worker fetches the gated S1-mini with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from .. import TARGET_SHARE, share_of
from .pools import POOL_STREAMS, worker_streams

SPEC = Path(__file__).with_name("endpoint.json")
SCALING = ("gpuIds", "gpuCount", "networkVolumeId", "workersMin", "workersMax", "idleTimeout", "scalerType",
           "scalerValue")
VOLUME = "/runpod-volume"  # where RunPod mounts an endpoint's network volume
SCALERS = ("QUEUE_DELAY", "REQUEST_COUNT")


class DeployError(Exception):
    pass


def load_spec(path: Path, image: str | None, volume: str | None, env: list[str], hf_token: str | None = None) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DeployError(f"{path}: {e}") from None
    for section, keys in (("template", ("name", "image", "containerDiskInGb", "env")), ("endpoint", SCALING)):
        missing = [k for k in keys if k not in spec.get(section, {})]
        if missing:
            raise DeployError(f"{path}: {section} lacks {', '.join(missing)}")
    if image:
        spec["template"]["image"] = image
    if volume is not None:
        spec["endpoint"]["networkVolumeId"] = volume
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DeployError(f"--env {item!r}: expected KEY=VALUE")
        spec["template"]["env"][key] = value
    t_env = spec["template"]["env"]
    if str(t_env.get("TTS_MODEL_SOURCE", "")).startswith("hf://") and hf_token and not t_env.get("HF_TOKEN"):
        t_env["HF_TOKEN"] = hf_token
    resolve_scaler_value(spec)
    if "YOUR_ORG" in spec["template"]["image"]:
        raise DeployError("set the image: --image REGISTRY/fish-tts-server:TAG (or edit endpoint.json)")
    check(spec)
    return spec


def resolve_scaler_value(spec: dict) -> None:
    """scalerValue "auto" (the shipped spec): TARGET_SHARE of the smallest worker's streams on gpuIds, so a new
    worker starts while the running ones still have room for the burst that comes during its cold start (with the
    value at 100%, one starts only once they are full). Follows gpuIds, TTS_MAX_BATCH and RUNPOD_CONCURRENCY."""
    t, e = spec["template"], spec["endpoint"]
    if e["scalerValue"] != "auto":
        return
    if e["scalerType"] != "REQUEST_COUNT":
        raise DeployError(f"scalerValue auto is for REQUEST_COUNT; {e['scalerType']} needs a number")
    try:
        e["scalerValue"] = share_of(worker_streams(e["gpuIds"], t["env"]))
    except KeyError as err:
        raise DeployError(f"gpuIds: unknown pool {err} (known: {', '.join(POOL_STREAMS)})") from None
    except ValueError as err:
        raise DeployError(f"env: {err}") from None


def check(spec: dict) -> None:
    """The settings RunPod would accept but that would scale or store wrongly."""
    t, e = spec["template"], spec["endpoint"]
    if e["scalerType"] not in SCALERS:
        raise DeployError(f"scalerType {e['scalerType']!r}: one of {', '.join(SCALERS)}")
    unknown = [p for p in e["gpuIds"].split(",") if p.strip() not in POOL_STREAMS]
    if unknown:
        raise DeployError(f"gpuIds: unknown pool {', '.join(unknown)} (known: {', '.join(POOL_STREAMS)})")
    if e["scalerType"] == "REQUEST_COUNT":
        try:
            streams = worker_streams(e["gpuIds"], t["env"])
        except ValueError as err:
            raise DeployError(f"env: {err}") from None
        if not isinstance(e["scalerValue"], int) or not 1 <= e["scalerValue"] <= streams:
            raise DeployError(f"scalerValue {e['scalerValue']}: REQUEST_COUNT counts one worker per scalerValue "
                              f"jobs, and the smallest worker on {e['gpuIds']} takes {streams} at once: use 1 to "
                              f"{streams}, or auto ({TARGET_SHARE:.0%} of them: {share_of(streams)})")
    if not e["networkVolumeId"] and any(str(v).startswith(VOLUME) for v in t["env"].values()):
        raise DeployError(f"the template keeps the model, kernel cache and voices on {VOLUME}: pass --volume ID "
                          "(a network volume in the data center of the GPUs)")


def endpoint_fields(e: dict, template_id: str) -> dict:
    """The saveEndpoint input for an existing endpoint (the fields create_endpoint sends, by their API names)."""
    fields = {"name": e["name"], "templateId": template_id, **{k: e[k] for k in SCALING}}
    if e.get("allowedCudaVersions"):
        fields["allowedCudaVersions"] = e["allowedCudaVersions"]
    if e.get("flashboot"):
        fields["flashBootType"] = "FLASHBOOT"
    return fields


def plan(spec: dict) -> dict:
    """What deploy() would save, without calling RunPod (--dry-run)."""
    t = spec["template"]
    template = {"name": template_name(t), "imageName": t["image"], "dockerArgs": t.get("dockerArgs", ""),
                "containerDiskInGb": t["containerDiskInGb"], "env": t["env"], "isServerless": True}
    return {"template": template, "endpoint": endpoint_fields(spec["endpoint"], "(the template's id)"),
            "worker_streams": worker_streams(spec["endpoint"]["gpuIds"], t["env"])}


def template_name(t: dict) -> str:
    digest = hashlib.sha256(json.dumps([t["image"], t.get("dockerArgs", ""), t["containerDiskInGb"], t["env"]],
                                       sort_keys=True).encode()).hexdigest()[:10]
    return f"{t['name']}-{digest}"


def _gql_str(value) -> str:
    return json.dumps(str(value))  # a GraphQL string literal


def _gql_value(key: str, value) -> str:
    if key == "flashBootType":
        return str(value)  # an enum: unquoted
    return _gql_str(value) if isinstance(value, str) else str(value)


def deploy(spec: dict) -> dict:
    import runpod
    from runpod.api.graphql import run_graphql_query

    t, e = spec["template"], spec["endpoint"]
    name = template_name(t)
    templates = run_graphql_query("query { myself { podTemplates { id name } } }")["data"]["myself"]["podTemplates"]
    template = next((x for x in templates if x["name"] == name), None)
    if template is None:
        template = runpod.create_template(name=name, image_name=t["image"], docker_start_cmd=t.get("dockerArgs"),
                                          container_disk_in_gb=t["containerDiskInGb"], env=t["env"],
                                          is_serverless=True)
        print(f"deploy: created template {name} ({template['id']})")
    endpoint = next((x for x in runpod.get_endpoints() if x["name"] == e["name"]), None)
    if endpoint is None:
        endpoint = runpod.create_endpoint(
            name=e["name"], template_id=template["id"], gpu_ids=e["gpuIds"],
            network_volume_id=e["networkVolumeId"] or None, idle_timeout=e["idleTimeout"],
            scaler_type=e["scalerType"], scaler_value=e["scalerValue"], workers_min=e["workersMin"],
            workers_max=e["workersMax"], flashboot=e.get("flashboot", False),
            allowed_cuda_versions=e.get("allowedCudaVersions"), gpu_count=e["gpuCount"])
        print(f"deploy: created endpoint {e['name']} ({endpoint['id']})")
        return {"endpoint_id": endpoint["id"], "template_id": template["id"], "action": "created"}
    actions = []
    if endpoint["templateId"] != template["id"]:
        runpod.update_endpoint_template(endpoint["id"], template["id"])
        actions.append(f"template -> {name}")
    changed = {k: e[k] for k in SCALING if endpoint.get(k) != e[k] and not (k == "networkVolumeId"
                                                                             and not endpoint.get(k) and not e[k])}
    if changed:
        # every setting goes with the save, FlashBoot and the CUDA versions too (the endpoint list the changes
        # are read from does not return those two)
        fields = [f"id: {_gql_str(endpoint['id'])}"]
        fields += [f"{k}: {_gql_value(k, v)}" for k, v in endpoint_fields(e, template["id"]).items()]
        run_graphql_query("mutation { saveEndpoint(input: {" + ", ".join(fields) + "}) { id } }")
        actions.append("settings: " + ", ".join(f"{k}={v}" for k, v in changed.items()))
    print(f"deploy: endpoint {e['name']} ({endpoint['id']}): {'; '.join(actions) or 'up to date'}")
    return {"endpoint_id": endpoint["id"], "template_id": template["id"],
            "action": "updated" if actions else "unchanged"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.runpod.deploy", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--image")
    ap.add_argument("--volume", help="network volume id (model + kernel cache live on it)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--dry-run", action="store_true", help="print what would be saved; call nothing")
    args = ap.parse_args(argv)
    if args.dry_run:
        try:
            print(json.dumps(plan(load_spec(args.spec, args.image, args.volume, args.env)), indent=2))
        except DeployError as e:
            print(f"deploy: {e}", file=sys.stderr)
            return 1
        return 0
    if not os.environ.get("RUNPOD_API_KEY"):
        print("deploy: set RUNPOD_API_KEY (https://www.runpod.io/console/user/settings)", file=sys.stderr)
        return 1
    import runpod
    from runpod import error as rp_error

    runpod.api_key = os.environ["RUNPOD_API_KEY"]
    try:
        spec = load_spec(args.spec, args.image, args.volume, args.env, os.environ.get("HF_TOKEN"))
        t_env = spec["template"]["env"]
        if str(t_env.get("TTS_MODEL_SOURCE", "")).startswith("hf://") and not t_env.get("HF_TOKEN"):
            print(f"deploy: warning: TTS_MODEL_SOURCE={t_env['TTS_MODEL_SOURCE']} and no HF_TOKEN (environment or "
                  "--env HF_TOKEN=...): workers cannot fetch a gated repository such as S1-mini", file=sys.stderr)
        result = deploy(spec)
    except DeployError as e:
        print(f"deploy: {e}", file=sys.stderr)
        return 1
    except (rp_error.AuthenticationError, rp_error.QueryError) as e:
        print(f"deploy: RunPod API: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
