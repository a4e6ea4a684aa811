"""infra/runpod: endpoint.json against the fields RunPod's API accepts, the scaling value against the worker's
concurrency, the CUDA versions against the image, deploy's dry run, and deploy (the SDK's GraphQL functions) and
invoke (runpod.Endpoint) against a local fake of RunPod's cloud APIs that records every request; invoked jobs run
through the real job handler on the CPU engine."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from conftest import ROOT, run_cli
from fake_runpod_cloud import FakeRunPodCloud

from infra import TARGET_SHARE
from infra.runpod.deploy import load_spec
from infra.runpod.pools import POOL_GPUS, POOL_STREAMS, worker_streams
from ttsengine import RunPodConfig
from ttsengine.engine import presets

pytest.importorskip("runpod", reason="runpod is a dev dependency")
from handlers.runpod.handler import JobHandler  # noqa: E402

IMAGE = "registry.example.com/fish-tts-server:1"
SPEC = ROOT / "infra" / "runpod" / "endpoint.json"

# What RunPod accepts, as we learned it (the spec's keys map 1:1 onto the API's input names; deploy.py renames
# only image -> imageName, flashboot -> flashBootType: FLASHBOOT):
# - template: the GraphQL saveTemplate input the runpod SDK builds (runpod/api/mutations/templates.py:
#   name, imageName, dockerArgs, containerDiskInGb, env [{key, value}], isServerless); secrets are referenced
#   in env values as {{ RUNPOD_SECRET_name }} (docs.runpod.io/pods/templates/secrets);
# - endpoint: the GraphQL saveEndpoint input the SDK builds (runpod/api/mutations/endpoints.py: name,
#   templateId, gpuIds, networkVolumeId, locations, idleTimeout, scalerType, scalerValue, workersMin,
#   workersMax, allowedCudaVersions, gpuCount, flashBootType); scalerType QUEUE_DELAY | REQUEST_COUNT and the
#   CUDA versions "11.8", "12.0" .. "13.0" as in the REST API's CreateEndpoint schema and the SDK's
#   min_cuda_version (docs.runpod.io/api-reference/endpoints/POST/endpoints, docs.runpod.io/sdk/configuration/
#   parameters); GPU pool ids from docs.runpod.io "GPU types" (GPU pools).
CUDA_VERSIONS = ["11.8", *(f"12.{i}" for i in range(10)), "13.0"]
_csv = r"^{0}(,{0})*$"
RUNPOD_SPEC_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["template", "endpoint"],
    "properties": {
        "template": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "image", "containerDiskInGb", "env"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "image": {"type": "string", "minLength": 1},
                "dockerArgs": {"type": "string"},
                "containerDiskInGb": {"type": "integer", "minimum": 1},
                "volumeInGb": {"type": "integer", "minimum": 0},
                "env": {"type": "object", "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                        "additionalProperties": {"type": "string"}},
            },
        },
        "endpoint": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "gpuIds", "gpuCount", "networkVolumeId", "workersMin", "workersMax", "idleTimeout",
                         "scalerType", "scalerValue"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "gpuIds": {"type": "string", "pattern": _csv.format("(" + "|".join(POOL_STREAMS) + ")")},
                "gpuCount": {"type": "integer", "minimum": 1},
                "networkVolumeId": {"type": "string"},
                "locations": {"type": "string"},
                "workersMin": {"type": "integer", "minimum": 0},
                "workersMax": {"type": "integer", "minimum": 1},
                "idleTimeout": {"type": "integer", "minimum": 1},
                "flashboot": {"type": "boolean"},
                "scalerType": {"enum": ["QUEUE_DELAY", "REQUEST_COUNT"]},
                # ours: "auto" is resolved by deploy.py before anything is sent (TARGET_SHARE of the worker's streams)
                "scalerValue": {"anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}]},
                "allowedCudaVersions": {"type": "string", "pattern": _csv.format(
                    "(" + "|".join(re.escape(v) for v in CUDA_VERSIONS) + ")")},
            },
        },
    },
}


@pytest.fixture
def cloud(engine, tmp_path):
    c = FakeRunPodCloud(JobHandler(engine, None, RunPodConfig(data_dir=tmp_path)).run)
    yield c
    c.stop()


def deploy(cloud, *args):
    volume = () if "--volume" in args else ("--volume", "vol1")
    return run_cli("infra.runpod.deploy", "--image", IMAGE, *volume, *args, env=cloud.env)


def _cuda(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def test_endpoint_json_is_what_runpod_accepts_and_scales_with_headroom():
    spec = json.loads(SPEC.read_text())
    jsonschema.validate(spec, RUNPOD_SPEC_SCHEMA)
    t, e = spec["template"], spec["endpoint"]
    assert e["scalerType"] == "REQUEST_COUNT" and e["flashboot"] is True
    # one worker per `scalerValue` jobs: 65% of the jobs the smallest worker takes at once (issue 48: at 100% a new
    # worker starts only once the running ones are full, and the burst during its cold start is refused)
    resolved = load_spec(SPEC, IMAGE, "vol1", [])
    jsonschema.validate(resolved, RUNPOD_SPEC_SCHEMA)
    assert e["scalerValue"] == "auto" and worker_streams(e["gpuIds"], t["env"]) == 96
    assert resolved["endpoint"]["scalerValue"] == round(96 * TARGET_SHARE) == 62
    # the network volume holds the model, the kernel cache and the voices (the image's ENV would otherwise put
    # them on the container disk, lost at every cold start); the gated model's token comes from a secret
    assert all(t["env"][k].startswith("/runpod-volume/") for k in ("TTS_MODEL_DIR", "TTS_CACHE_DIR", "TTS_DATA_DIR"))
    assert re.fullmatch(r"\{\{ RUNPOD_SECRET_\w+ \}\}", t["env"]["HF_TOKEN"])


def test_cuda_versions_match_the_image():
    """A host qualifies when its driver runs the image's CUDA: the base image's version or newer, never older."""
    base = re.search(r"^ARG BASE_IMAGE=\S*cuda(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    for path, versions in ((SPEC, json.loads(SPEC.read_text())["endpoint"]["allowedCudaVersions"].split(",")),
                           (ROOT / ".runpod" / "hub.json",
                            json.loads((ROOT / ".runpod" / "hub.json").read_text())["config"]["allowedCudaVersions"])):
        assert base in versions and all(_cuda(v) >= _cuda(base) for v in versions), (path, versions, base)


def test_pool_streams_are_the_memory_presets():
    for pool, gpus in POOL_GPUS.items():
        # a card reports a little less than its nominal memory (a 20 GB card: under 20 GiB)
        slots = [presets.choose(name, int(gb * 0.97 * presets.GB)).max_batch for name, gb in gpus]
        assert POOL_STREAMS[pool] == min(slots), (pool, slots)
    assert worker_streams("ADA_24,HOPPER_141", {}) == 48
    assert worker_streams("ADA_24", {"TTS_MAX_BATCH": "32"}) == 32
    assert worker_streams("ADA_24", {"RUNPOD_CONCURRENCY": "8", "TTS_MAX_BATCH": "32"}) == 8


def test_dry_run_needs_no_key_and_checks_the_spec(tmp_path):
    no_key = {"RUNPOD_API_KEY": "", "RUNPOD_API_BASE_URL": "http://127.0.0.1:9"}  # nothing listens there
    out = run_cli("infra.runpod.deploy", "--dry-run", "--image", IMAGE, "--volume", "vol1", env=no_key)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["template"]["imageName"] == IMAGE and plan["template"]["name"].startswith("fish-tts-")
    assert plan["endpoint"]["scalerType"] == "REQUEST_COUNT" and plan["endpoint"]["scalerValue"] == 62
    assert plan["endpoint"]["flashBootType"] == "FLASHBOOT" and plan["endpoint"]["networkVolumeId"] == "vol1"
    assert plan["worker_streams"] == 96

    no_volume = run_cli("infra.runpod.deploy", "--dry-run", "--image", IMAGE, env=no_key)
    assert no_volume.returncode == 1 and "--volume" in no_volume.stderr
    spec = json.loads(SPEC.read_text())
    spec["endpoint"]["gpuIds"] = "ADA_24,ADA_48_PRO"  # an L4 worker takes 48 jobs: auto follows
    (tmp_path / "auto.json").write_text(json.dumps(spec))
    auto = run_cli("infra.runpod.deploy", "--dry-run", "--spec", str(tmp_path / "auto.json"), "--image", IMAGE,
                   "--volume", "v", env=no_key)
    assert auto.returncode == 0 and json.loads(auto.stdout)["endpoint"]["scalerValue"] == 31, auto.stderr
    spec["endpoint"]["scalerValue"] = 96  # a number is taken as it is, up to the smallest worker's streams
    (tmp_path / "s.json").write_text(json.dumps(spec))
    too_many = run_cli("infra.runpod.deploy", "--dry-run", "--spec", str(tmp_path / "s.json"), "--image", IMAGE,
                       "--volume", "v", env=no_key)
    assert too_many.returncode == 1 and "scalerValue 96" in too_many.stderr and "1 to 48, or auto (65%" in \
        too_many.stderr, too_many.stderr
    spec["endpoint"]["scalerType"] = "QUEUE_DELAY"
    spec["endpoint"]["scalerValue"] = "auto"
    (tmp_path / "q.json").write_text(json.dumps(spec))
    queue_delay = run_cli("infra.runpod.deploy", "--dry-run", "--spec", str(tmp_path / "q.json"), "--image", IMAGE,
                          "--volume", "v", env=no_key)
    assert queue_delay.returncode == 1 and "scalerValue auto is for REQUEST_COUNT" in queue_delay.stderr
    smaller = run_cli("infra.runpod.deploy", "--dry-run", "--spec", str(tmp_path / "s.json"), "--image", IMAGE,
                      "--volume", "v", "--env", "RUNPOD_CONCURRENCY=96", env=no_key)
    assert smaller.returncode == 0, smaller.stderr  # the worker is told to take 96


def test_deploy_creates_then_is_idempotent_then_updates(cloud):
    first = deploy(cloud)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout.strip().splitlines()[-1])
    assert result["action"] == "created"
    (template,) = cloud.templates
    assert template["imageName"] == IMAGE and template["isServerless"] == "true" and template["dockerArgs"] == "runpod"
    assert template["env"]["TTS_MODEL_SOURCE"] == "hf://fishaudio/openaudio-s1-mini"
    assert template["containerDiskInGb"] == 20
    (ep,) = cloud.endpoints
    spec = json.loads((ROOT / "infra" / "runpod" / "endpoint.json").read_text())["endpoint"]
    assert (ep["templateId"], ep["gpuIds"], ep["workersMax"], ep["idleTimeout"], ep["flashBootType"]) == \
        (template["id"], spec["gpuIds"], spec["workersMax"], spec["idleTimeout"], "FLASHBOOT")
    assert ep["allowedCudaVersions"] == spec["allowedCudaVersions"] and ep["gpuCount"] == 1

    cloud.queries.clear()
    again = deploy(cloud)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert not any("mutation" in q for q in cloud.queries)  # nothing created or changed

    changed = deploy(cloud, "--env", "TTS_QUANT=int8", "--volume", "vol123")
    assert changed.returncode == 0, changed.stderr
    assert len(cloud.templates) == 2 and cloud.templates[1]["env"]["TTS_QUANT"] == "int8"
    assert ep["templateId"] == cloud.templates[1]["id"] and ep["networkVolumeId"] == "vol123"
    assert any("updateEndpointTemplate" in q for q in cloud.queries)
    # the save carries FlashBoot and the CUDA versions (the endpoint list does not return them to compare)
    assert ep["flashBootType"] == "FLASHBOOT" and ep["allowedCudaVersions"] == spec["allowedCudaVersions"]
    assert ep["scalerType"] == "REQUEST_COUNT" and ep["scalerValue"] == 62  # "auto" resolved


def test_deploy_forwards_hf_token(cloud, tmp_path):
    """The spec's hf:// source needs HF_TOKEN on the worker (issue 47): the shipped spec refers to a RunPod secret
    (the token never lands in the template); a spec without one takes it from the deploying environment."""
    shipped = run_cli("infra.runpod.deploy", "--image", IMAGE, "--volume", "v", env={**cloud.env, "HF_TOKEN": "hf_abc"})
    assert shipped.returncode == 0, shipped.stderr
    assert cloud.templates[-1]["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf_token }}"
    spec = json.loads(SPEC.read_text())
    del spec["template"]["env"]["HF_TOKEN"]
    mine = tmp_path / "spec.json"
    mine.write_text(json.dumps(spec))
    warned = run_cli("infra.runpod.deploy", "--spec", str(mine), "--image", IMAGE, "--volume", "v",
                     env={**cloud.env, "HF_TOKEN": ""})
    assert warned.returncode == 0 and "no HF_TOKEN" in warned.stderr, warned.stderr
    assert "HF_TOKEN" not in cloud.templates[-1]["env"]
    ok = run_cli("infra.runpod.deploy", "--spec", str(mine), "--image", IMAGE, "--volume", "v",
                 env={**cloud.env, "HF_TOKEN": "hf_abc"})
    assert ok.returncode == 0 and "no HF_TOKEN" not in ok.stderr, ok.stderr
    assert cloud.templates[-1]["env"]["HF_TOKEN"] == "hf_abc"
    given = run_cli("infra.runpod.deploy", "--spec", str(mine), "--image", IMAGE, "--volume", "v", "--env",
                    "HF_TOKEN={{ RUNPOD_SECRET_hf }}", env={**cloud.env, "HF_TOKEN": "hf_abc"})
    assert given.returncode == 0 and cloud.templates[-1]["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf }}"


def test_deploy_errors_are_one_line(cloud, tmp_path):
    bad_key = run_cli("infra.runpod.deploy", "--image", IMAGE, "--volume", "v",
                      env={**cloud.env, "RUNPOD_API_KEY": "wrong"})
    assert bad_key.returncode == 1 and "Unauthorized" in bad_key.stderr and "Traceback" not in bad_key.stderr
    no_image = run_cli("infra.runpod.deploy", "--volume", "v", env=cloud.env)
    assert no_image.returncode == 1 and "--image" in no_image.stderr
    broken = tmp_path / "spec.json"
    broken.write_text('{"template": {"name": "x"}, "endpoint": {}}')
    bad_spec = run_cli("infra.runpod.deploy", "--spec", str(broken), "--volume", "v", env=cloud.env)
    assert bad_spec.returncode == 1 and "template lacks image" in bad_spec.stderr
    no_key = run_cli("infra.runpod.deploy", env={**cloud.env, "RUNPOD_API_KEY": ""})
    assert no_key.returncode == 1 and "RUNPOD_API_KEY" in no_key.stderr


def test_invoke_whole_and_streamed(cloud, tmp_path):
    assert deploy(cloud).returncode == 0
    ep = cloud.endpoints[0]["id"]
    whole = run_cli("infra.runpod.invoke", "--endpoint", ep, "--text", "Hello RunPod.", "--seed", "4",
                    "--out", str(tmp_path / "a.wav"), env=cloud.env)
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "a.wav").read_bytes()[:4] == b"RIFF"
    streamed = run_cli("infra.runpod.invoke", "--endpoint", ep, "--text", "Streamed.", "--stream",
                       "--out", str(tmp_path / "b.pcm"), env=cloud.env)
    assert streamed.returncode == 0, streamed.stderr
    info = json.loads(streamed.stdout.split(": ", 2)[2])
    assert info["done"] is True and info["bytes"] == (tmp_path / "b.pcm").stat().st_size > 0
    failed = run_cli("infra.runpod.invoke", "--endpoint", ep, "--text", "", "--out", str(tmp_path / "c.wav"),
                     env=cloud.env)
    assert failed.returncode == 1 and "text is empty" in failed.stderr and "Traceback" not in failed.stderr
