"""infra.sagemaker.deploy against a local moto server (S3, SageMaker, IAM, Application Auto Scaling, CloudWatch):
moto cannot run the container, so the tests check the calls and the parameters it recorded."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from types import SimpleNamespace

import boto3
import pytest
from conftest import ROOT, complete_model, run_cli

from infra.sagemaker import autoscale
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
    """A boto3 session whose SageMaker calls are recorded (name, params). moto has no UpdateEndpoint and no
    inference-component API: those calls are answered here after recording them (the components kept in a dict,
    so that describe, list and delete see what create made); every other call goes to the moto server."""
    session = boto3.session.Session()
    calls, components = [], {}

    def record(model, params, **_):
        calls.append((model.name, copy.deepcopy(dict(params))))

    def ok(body):
        return SimpleNamespace(status_code=200, headers={}), body

    def answer(model, **_):
        op = model.name
        if op == "UpdateEndpoint":
            return ok({"EndpointArn": "arn:aws:sagemaker:::endpoint/x"})
        if "InferenceComponent" not in op:
            return None
        params = calls[-1][1]  # recorded just before, for this call
        name = params.get("InferenceComponentName")
        if op == "ListInferenceComponents":
            return ok({"InferenceComponents": [{"InferenceComponentName": n, "EndpointName": c["EndpointName"]}
                                               for n, c in components.items()
                                               if c["EndpointName"] == params.get("EndpointNameEquals")]})
        if op == "CreateInferenceComponent":
            components[name] = params
        elif name not in components:
            return SimpleNamespace(status_code=400, headers={}), {"Error": {
                "Code": "ValidationException", "Message": f"Could not find inference component '{name}'."}}
        elif op == "UpdateInferenceComponent":
            components[name] = {**components[name], **params}
        elif op == "DeleteInferenceComponent":
            del components[name]
            return ok({})
        elif op == "DescribeInferenceComponent":
            return ok({**components[name], "InferenceComponentStatus": "InService"})
        return ok({"InferenceComponentArn": f"arn:aws:sagemaker:us-east-1:123456789012:inference-component/{name}"})

    session.events.register("before-parameter-build.sagemaker", record)
    session.events.register("before-call.sagemaker", answer)
    return session, calls


@pytest.fixture
def moto_components(monkeypatch):
    """moto 5.2.5 refuses two things an inference-component endpoint needs: the scalable dimension
    sagemaker:inference-component:DesiredCopyCount (not in its enum) and an endpoint config whose variant names
    no model (KeyError). Its server runs in this process: both checks are widened here; the rest is moto's."""
    from enum import Enum

    from moto.applicationautoscaling import models, responses
    from moto.sagemaker.models import SageMakerModelBackend

    values = {d.name: d.value for d in models.ScalableDimensionValueSet}
    widened = Enum("ScalableDimensionValueSet", {**values, "SAGEMAKER_COPY_COUNT": autoscale.COPY_DIMENSION})
    monkeypatch.setattr(models, "ScalableDimensionValueSet", widened)
    monkeypatch.setattr(responses, "ScalableDimensionValueSet", widened)
    check = SageMakerModelBackend.validate_production_variants
    monkeypatch.setattr(SageMakerModelBackend, "validate_production_variants",
                        lambda self, variants: check(self, [v for v in variants if "ModelName" in v]))


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

    assert not boto3.client("cloudwatch").describe_alarms(AlarmNames=["tts-e-scale-from-zero"])["MetricAlarms"]

    time.sleep(1.1)  # a new timestamped config name
    calls.clear()
    second = dp.deploy(spec(tmp_path, role, instance_type="ml.g4dn.2xlarge"), poll_s=0, session=session)
    assert second["model_data"] == first["model_data"]  # same archive: not uploaded twice
    names = [name for name, _ in calls]
    assert names.index("CreateModel") < names.index("CreateEndpointConfig") < names.index("UpdateEndpoint")
    assert "CreateEndpoint" not in names and not [n for n in names if "InferenceComponent" in n]
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


def _scaling(resource):
    """(the scalable target, {policy name: policy}) that moto holds for one resource."""
    aas = boto3.client("application-autoscaling")
    targets = [t for t in aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
               if t["ResourceId"] == resource]
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)["ScalingPolicies"]
    return (targets[0] if targets else None), {p["PolicyName"]: p for p in policies if p["ResourceId"] == resource}


def _alarm(name):
    alarms = boto3.client("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"]
    return alarms[0] if alarms else None


def test_async_scales_on_the_backlog_per_instance(aws, tmp_path, recorded):
    _, role = aws
    session, calls = recorded
    out = dp.deploy(spec(tmp_path, role, name="tts-q", async_output="s3://tts-models/q/", max_instances=3),
                    poll_s=0, session=session)
    config = boto3.client("sagemaker").describe_endpoint_config(EndpointConfigName=out["config"])
    # up to the instance's streams at once (g4dn.xlarge: 1 GPU x 16); the rest waits in SageMaker's queue
    assert config["AsyncInferenceConfig"]["ClientConfig"]["MaxConcurrentInvocationsPerInstance"] == 16
    target, policies = _scaling("endpoint/tts-q/variant/AllTraffic")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 3)
    assert list(policies) == ["tts-q-backlog"]  # not the concurrency metric: it counts only sync requests
    tracking = policies["tts-q-backlog"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["CustomizedMetricSpecification"] == {
        "MetricName": "ApproximateBacklogSizePerInstance", "Namespace": "AWS/SageMaker",
        "Dimensions": [{"Name": "EndpointName", "Value": "tts-q"}], "Statistic": "Average"}
    assert tracking["TargetValue"] == dp.target_concurrency("ml.g4dn.xlarge") == 10
    assert _alarm("tts-q-scale-from-zero") is None
    gone = dp.delete("tts-q", session=session)
    assert "scaling policy tts-q-backlog" in gone and "autoscaling endpoint/tts-q/variant/AllTraffic" in gone
    assert _scaling("endpoint/tts-q/variant/AllTraffic") == (None, {})


def test_async_scale_to_zero_wakes_on_a_queued_request_and_can_be_turned_off(aws, tmp_path, recorded):
    _, role = aws
    session, calls = recorded
    resource = "endpoint/tts-qz/variant/AllTraffic"
    base = dict(name="tts-qz", async_output="s3://tts-models/qz/", max_instances=3)
    dp.deploy(spec(tmp_path, role, scale_to_zero=True, **base), poll_s=0, session=session)
    target, policies = _scaling(resource)
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, 3)
    assert set(policies) == {"tts-qz-backlog", "tts-qz-scale-from-zero"}
    step = policies["tts-qz-scale-from-zero"]
    assert step["PolicyType"] == "StepScaling" and step["StepScalingPolicyConfiguration"] == {
        "AdjustmentType": "ChangeInCapacity", "Cooldown": autoscale.WAKE_COOLDOWN_S, "MetricAggregationType": "Average",
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}
    alarm = _alarm("tts-qz-scale-from-zero")
    assert (alarm["MetricName"], alarm["Namespace"], alarm["Statistic"]) == \
        ("HasBacklogWithoutCapacity", "AWS/SageMaker", "Average")
    assert alarm["Dimensions"] == [{"Name": "EndpointName", "Value": "tts-qz"}]
    assert (alarm["ComparisonOperator"], alarm["Threshold"], alarm["Period"], alarm["EvaluationPeriods"]) == \
        ("GreaterThanOrEqualToThreshold", 1, 60, 1)
    assert alarm["AlarmActions"] == [step["PolicyARN"]]  # the alarm fires the step policy

    time.sleep(1.1)  # off again: updated in place, the floor back to 1, the step policy and alarm gone
    dp.deploy(spec(tmp_path, role, **base), poll_s=0, session=session)
    target, policies = _scaling(resource)
    assert target["MinCapacity"] == 1 and set(policies) == {"tts-qz-backlog"}
    assert _alarm("tts-qz-scale-from-zero") is None and "UpdateEndpoint" in dict(calls)

    time.sleep(1.1)
    dp.deploy(spec(tmp_path, role, scale_to_zero=True, **base), poll_s=0, session=session)
    gone = dp.delete("tts-qz", session=session)
    assert {"alarm tts-qz-scale-from-zero", "scaling policy tts-qz-backlog", "scaling policy tts-qz-scale-from-zero",
            f"autoscaling {resource}", "endpoint tts-qz"} <= set(gone)
    assert _scaling(resource) == (None, {}) and _alarm("tts-qz-scale-from-zero") is None
    assert dp.delete("tts-qz", session=session) == []


def test_realtime_scale_to_zero_hosts_an_inference_component(aws, tmp_path, recorded, moto_components):
    _, role = aws
    session, calls = recorded
    resource = "inference-component/tts-z-tts"
    first = dp.deploy(spec(tmp_path, role, name="tts-z", scale_to_zero=True, max_instances=4), poll_s=0,
                      session=session)
    assert first["component"] == "tts-z-tts"
    made = dict(calls)
    config = made["CreateEndpointConfig"]
    assert config["ExecutionRoleArn"] == role
    (variant,) = config["ProductionVariants"]
    assert "ModelName" not in variant  # the component brings the model
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4}
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert made["CreateInferenceComponent"] == {
        "InferenceComponentName": "tts-z-tts", "EndpointName": "tts-z", "VariantName": "AllTraffic",
        "Specification": {"ModelName": first["model"],
                          "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 1,
                                                          "MinMemoryRequiredInMb": 4096},
                          "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": 1200,
                                                "ModelDataDownloadTimeoutInSeconds": 1200}},
        "RuntimeConfig": {"CopyCount": 1}}
    names = [n for n, _ in calls]  # the component goes onto an endpoint in service
    assert names.index("CreateEndpoint") < names.index("CreateInferenceComponent")

    target, policies = _scaling(resource)
    assert (target["ScalableDimension"], target["MinCapacity"], target["MaxCapacity"]) == \
        ("sagemaker:inference-component:DesiredCopyCount", 0, 4)
    assert _scaling("endpoint/tts-z/variant/AllTraffic") == (None, {})  # SageMaker manages the instances
    tracking = policies["tts-z-concurrency"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
    assert tracking["TargetValue"] == 10  # a copy is a whole instance: the instance's target
    step = policies["tts-z-scale-from-zero"]
    assert step["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
    alarm = _alarm("tts-z-scale-from-zero")
    assert (alarm["MetricName"], alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == \
        ("NoCapacityInvocationFailures", "Sum", "GreaterThanOrEqualToThreshold", 1)
    assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": "tts-z-tts"}]
    assert alarm["AlarmActions"] == [step["PolicyARN"]]

    time.sleep(1.1)  # update in place: the component gets the new model, its copy count stays autoscaling's
    calls.clear()
    second = dp.deploy(spec(tmp_path, role, name="tts-z", scale_to_zero=True, max_instances=4), poll_s=0,
                       session=session)
    made = dict(calls)
    assert "CreateInferenceComponent" not in made and "UpdateEndpoint" in made
    assert made["UpdateInferenceComponent"]["Specification"]["ModelName"] == second["model"]
    assert "RuntimeConfig" not in made["UpdateInferenceComponent"]

    calls.clear()  # the other kind of endpoint under the same name: refused before anything is made
    with pytest.raises(dp.DeployError, match="delete it first"):
        dp.deploy(spec(tmp_path, role, name="tts-z", max_instances=4), poll_s=0, session=session)
    assert "CreateModel" not in dict(calls)

    gone = dp.delete("tts-z", session=session)
    assert {"alarm tts-z-scale-from-zero", "scaling policy tts-z-concurrency", "scaling policy tts-z-scale-from-zero",
            f"autoscaling {resource}", "inference component tts-z-tts", "endpoint tts-z",
            f"model {first['model']}", f"model {second['model']}"} <= set(gone)
    assert gone.index("inference component tts-z-tts") < gone.index("endpoint tts-z")
    assert _scaling(resource) == (None, {}) and _alarm("tts-z-scale-from-zero") is None
    assert dp.delete("tts-z", session=session) == []


@pytest.mark.parametrize("args, says", [
    (["--scale-to-zero"], "needs --max-instances"),
    (["--scale-to-zero", "--max-instances", "3", "--min-instances", "1"], "drop --min-instances"),
    (["--scale-to-zero", "--max-instances", "3", "--no-scale-in"], "contradict"),
    (["--max-instances", "3", "--min-instances", "0"], "needs --scale-to-zero"),
    (["--max-instances", "2", "--min-instances", "3"], "above --max-instances"),
    (["--scale-to-zero", "--max-instances", "3", "--instance-type", "ml.x9.large"], "not in the instance table"),
    (["--max-instances", "3", "--instance-type", "ml.x9.large"], "--target-concurrency"),
])
def test_scaling_combinations_that_cannot_work_are_one_line(args, says, capsys):
    code = dp.main(["deploy", "--name", "x", "--image", "i", "--role", "r", "--model-data", "s3://b/m.tar.gz",
                    "--region", "us-east-1", *args])
    err = capsys.readouterr().err
    assert code == 1 and says in err and err.count("\n") == 1, err


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


def test_an_async_target_is_a_share_of_what_an_instance_may_run_at_once():
    # a p5 serves 2,048 streams, but an async instance runs at most 1,000 at once (SageMaker's cap): its backlog
    # target is 65% of those 1,000, not 65% of 2,048 (1,331: above what it may run, so it would scale out late)
    base = dict(name="p5", image="i", role="r", instance_type="ml.p5.48xlarge", max_instances=4)
    assert dp.scaling(dp.DeploySpec(**base)).target == 1331
    assert dp.scaling(dp.DeploySpec(**base, async_output="s3://b/out/")).target == 650
    assert dp.scaling(dp.DeploySpec(**base, async_output="s3://b/out/", target_concurrency=80)).target == 80
