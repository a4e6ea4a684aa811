"""infra.sagemaker.deploy against a local moto server (S3, SageMaker, IAM, Application Auto Scaling): moto
cannot run the container, so the tests check the calls and the parameters it recorded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import boto3
import pytest
from conftest import ROOT, complete_model, run_cli

from infra.sagemaker import deploy as dp

ROLE_DOC = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": ' \
           '"sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}'


@pytest.fixture
def aws(s3_server, monkeypatch):
    url = s3_server["AWS_ENDPOINT_URL_S3"]
    env = {**s3_server, "AWS_ENDPOINT_URL": url}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3").create_bucket(Bucket="tts-models")
    iam = boto3.client("iam")
    try:
        role = iam.get_role(RoleName="tts-sm")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="tts-sm", AssumeRolePolicyDocument=ROLE_DOC)["Role"]["Arn"]
    return env, role


def _model(tmp_path):
    return tmp_path / "m" if (tmp_path / "m").is_dir() else complete_model(tmp_path / "m")


def spec(tmp_path, role, **kw):
    base = dict(name="tts-e", image="123456789012.dkr.ecr.us-east-1.amazonaws.com/fish-tts:1", role=role,
                bucket="tts-models", model_dir=_model(tmp_path), env={"TTS_QUANT": "int8"},
                # moto knows instance types up to g4dn; g5/g6/p4d/p5 pass the same code path on AWS
                instance_type="ml.g4dn.xlarge")
    return dp.DeploySpec(**{**base, **kw})


@pytest.fixture
def recorded():
    """A boto3 session whose SageMaker calls are recorded (name, params). moto has no UpdateEndpoint: that one
    call is answered here after recording it; every other call goes to the moto server."""
    session = boto3.session.Session()
    calls = []

    def record(model, params, **_):
        calls.append((model.name, dict(params)))

    def answer_update(model, **_):
        if model.name == "UpdateEndpoint":
            return SimpleNamespace(status_code=200, headers={}), {"EndpointArn": "arn:aws:sagemaker:::endpoint/x"}
        return None

    session.events.register("before-parameter-build.sagemaker", record)
    session.events.register("before-call.sagemaker", answer_update)
    return session, calls


def test_deploy_creates_then_updates_in_place_and_deletes(aws, tmp_path, recorded):
    _, role = aws
    session, calls = recorded
    sm = boto3.client("sagemaker")
    first = dp.deploy(spec(tmp_path, role, max_instances=4, target_concurrency=50), poll_s=0, session=session)
    assert first["status"] == "InService"
    model = sm.describe_model(ModelName=first["model"])
    assert model["PrimaryContainer"]["ModelDataUrl"] == first["model_data"]
    assert model["PrimaryContainer"]["Environment"] == {"TTS_QUANT": "int8"} and model["ExecutionRoleArn"] == role
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=first["config"])["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g4dn.xlarge"
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1200
    aas = boto3.client("application-autoscaling")
    (target,) = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == \
        ("endpoint/tts-e/variant/AllTraffic", 1, 4)
    (policy,) = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 50
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == dp.CONCURRENCY_METRIC == \
        "SageMakerVariantConcurrentRequestsPerModelHighResolution"
    assert tracking["ScaleInCooldown"] == dp.SCALE_IN_COOLDOWN_S >= 300 and tracking["DisableScaleIn"] is False

    import time
    time.sleep(1.1)  # a new timestamped config name
    calls.clear()
    second = dp.deploy(spec(tmp_path, role, instance_type="ml.g4dn.2xlarge"), poll_s=0, session=session)
    assert second["model_data"] == first["model_data"]  # same archive: not uploaded twice
    names = [name for name, _ in calls]
    assert names[:3] == ["CreateModel", "CreateEndpointConfig", "DescribeEndpoint"] and "CreateEndpoint" not in names
    update = dict(calls)["UpdateEndpoint"]
    assert update == {"EndpointName": "tts-e", "EndpointConfigName": second["config"]}
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=second["config"])["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g4dn.2xlarge" and variant["ModelName"] == second["model"]

    gone = dp.delete("tts-e")
    assert "endpoint tts-e" in gone and f"endpoint config {first['config']}" in gone
    assert f"model {second['model']}" in gone
    assert dp.delete("tts-e") == []  # idempotent


def test_async_endpoint_config(aws, tmp_path):
    _, role = aws
    out = dp.deploy(spec(tmp_path, role, name="tts-async", async_output="s3://tts-models/async/",
                         sns_topic="arn:aws:sns:us-east-1:123456789012:tts"), poll_s=0)
    cfg = boto3.client("sagemaker").describe_endpoint_config(EndpointConfigName=out["config"])
    assert cfg["AsyncInferenceConfig"]["OutputConfig"]["S3OutputPath"] == "s3://tts-models/async/"
    assert cfg["AsyncInferenceConfig"]["OutputConfig"]["NotificationConfig"]["SuccessTopic"].endswith(":tts")


def test_cli_errors_are_one_line(aws, tmp_path):
    env, role = aws
    proc = run_cli("infra.sagemaker.deploy", "deploy", "--name", "x", "--image", "i", "--role", role, env=env)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--model-data" in proc.stderr
    proc = run_cli("infra.sagemaker.deploy", "deploy", "--name", "x", "--image", "i", "--role", role,
                   "--model-dir", str(tmp_path), "--bucket", "tts-models", env=env)
    assert proc.returncode == 1 and "missing config.json" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("infra.sagemaker.deploy", "deploy", "--name", "x", "--image", "i", "--role", role,
                   "--model-data", "s3://b/m.tar.gz", "--target-invocations", "100", env=env)
    assert proc.returncode == 1 and "--target-concurrency" in proc.stderr and proc.stderr.count("\n") == 1
    noregion = {k: v for k, v in env.items()}
    noregion["AWS_DEFAULT_REGION"] = ""
    proc = run_cli("infra.sagemaker.deploy", "delete", "--name", "x", env=noregion)
    assert proc.returncode == 1 and "no AWS region" in proc.stderr


def test_cloudformation_template_passes_cfn_lint():
    from conftest import ROOT

    exe = shutil.which("cfn-lint", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    if exe is None:
        pytest.skip("cfn-lint is a dev dependency")
    proc = subprocess.run([exe, str(ROOT / "infra" / "sagemaker" / "endpoint.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_template_and_tool_create_the_same_resources():
    """The template mirrors deploy(): same variant name, health-check timeout default, autoscaling metric."""
    import yaml
    from conftest import ROOT

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    t = yaml.load((ROOT / "infra" / "sagemaker" / "endpoint.yaml").read_text(), Loader=Loader)
    (variant,) = t["Resources"]["EndpointConfig"]["Properties"]["ProductionVariants"]
    assert variant["VariantName"] == dp.VARIANT
    assert t["Parameters"]["StartupTimeoutSeconds"]["Default"] == dp.DeploySpec.startup_timeout_s
    assert set(t["Parameters"]["InstanceType"]["AllowedValues"]) == set(dp.INSTANCE_TYPES)
    policy = t["Resources"]["ScalingPolicy"]["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PredefinedMetricSpecification"]["PredefinedMetricType"] == dp.CONCURRENCY_METRIC
    assert policy["ScaleInCooldown"] == dp.SCALE_IN_COOLDOWN_S and policy["ScaleOutCooldown"] == dp.SCALE_OUT_COOLDOWN_S
    # the template's per-type targets are the tool's
    assert {k: v["Target"] for k, v in t["Mappings"]["StreamTargets"].items()} == \
        {name: dp.target_concurrency(name) for name in dp.INSTANCE_TYPES}
    assert t["Resources"]["ScalableTarget"]["Properties"]["ScalableDimension"] == dp.SCALABLE_DIMENSION


def test_ecr_repository_and_login_token(aws):
    from infra.sagemaker import ecr as ecr_tool

    ecr = boto3.client("ecr")
    uri = ecr_tool.repository_uri(ecr, "fish-tts-server")
    assert uri.endswith("/fish-tts-server") and ecr_tool.repository_uri(ecr, "fish-tts-server") == uri
    registry, user, password = ecr_tool.credentials(ecr)
    assert user == "AWS" and password and "dkr.ecr" in registry


def test_ecr_cli_without_docker_is_one_line(aws):
    """The repository and login parts run against moto (above); moto has no registry to push to, so the
    docker half is checked only for its failure path here."""
    env, _ = aws
    proc = run_cli("infra.sagemaker.ecr", "--repository", "fish-tts-server", "--tag", "nothing-built", "--no-build",
                   env={**env, "PATH": "/nonexistent"})
    assert proc.returncode == 1 and proc.stderr.startswith("ecr: ") and proc.stderr.count("\n") == 1


def test_the_instance_table_follows_the_memory_presets():
    from ttsengine.engine.presets import by_name, choose

    for name, (gpus, gpu, gb, preset, streams) in dp.INSTANCE_TYPES.items():
        assert choose(f"NVIDIA {gpu}", gb * (1 << 30)).name == preset, name  # what the engine picks there
        assert by_name(preset).max_batch == streams and gpus >= 1, name
    out = subprocess.run([sys.executable, "-m", "infra.sagemaker.deploy", "instance-types"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "ml.g5.12xlarge        4 A10G      24 GB  a10g           256    166  preset" in out
    assert "ml.p5.48xlarge        8 H100      80 GB  h100          2048   1331  measured" in out
    # the target: 60-70% of the streams an instance serves
    for name, (gpus, *_, streams) in dp.INSTANCE_TYPES.items():
        assert 0.6 <= dp.target_concurrency(name) / (gpus * streams) <= 0.7, name
    with pytest.raises(dp.DeployError, match="--target-concurrency"):
        dp.target_concurrency("ml.x1.unknown")
