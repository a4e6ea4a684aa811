"""infra/runpod: deploy (the SDK's GraphQL functions) and invoke (runpod.Endpoint) against a local fake of
RunPod's cloud APIs that records every request; invoked jobs run through the real job handler on the CPU
engine."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli
from fake_runpod_cloud import FakeRunPodCloud

from ttsengine import RunPodConfig

pytest.importorskip("runpod", reason="runpod is a dev dependency")
from handlers.runpod.handler import JobHandler  # noqa: E402

IMAGE = "registry.example.com/fish-tts-server:1"


@pytest.fixture
def cloud(engine, tmp_path):
    c = FakeRunPodCloud(JobHandler(engine, None, RunPodConfig(data_dir=tmp_path)).run)
    yield c
    c.stop()


def deploy(cloud, *args):
    return run_cli("infra.runpod.deploy", "--image", IMAGE, *args, env=cloud.env)


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


def test_deploy_forwards_hf_token(cloud):
    """The spec's hf:// source needs HF_TOKEN on the worker: taken from the deploying environment (issue 47)."""
    warned = run_cli("infra.runpod.deploy", "--image", IMAGE, env={**cloud.env, "HF_TOKEN": ""})
    assert warned.returncode == 0 and "no HF_TOKEN" in warned.stderr
    assert "HF_TOKEN" not in cloud.templates[-1]["env"]
    ok = run_cli("infra.runpod.deploy", "--image", IMAGE, env={**cloud.env, "HF_TOKEN": "hf_abc"})
    assert ok.returncode == 0 and "no HF_TOKEN" not in ok.stderr, ok.stderr
    assert cloud.templates[-1]["env"]["HF_TOKEN"] == "hf_abc"
    given = run_cli("infra.runpod.deploy", "--image", IMAGE, "--env", "HF_TOKEN={{ RUNPOD_SECRET_hf }}",
                    env={**cloud.env, "HF_TOKEN": "hf_abc"})
    assert given.returncode == 0 and cloud.templates[-1]["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf }}"


def test_deploy_errors_are_one_line(cloud, tmp_path):
    bad_key = run_cli("infra.runpod.deploy", "--image", IMAGE, env={**cloud.env, "RUNPOD_API_KEY": "wrong"})
    assert bad_key.returncode == 1 and "Unauthorized" in bad_key.stderr and "Traceback" not in bad_key.stderr
    no_image = run_cli("infra.runpod.deploy", env=cloud.env)
    assert no_image.returncode == 1 and "--image" in no_image.stderr
    broken = tmp_path / "spec.json"
    broken.write_text('{"template": {"name": "x"}, "endpoint": {}}')
    bad_spec = run_cli("infra.runpod.deploy", "--spec", str(broken), env=cloud.env)
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
