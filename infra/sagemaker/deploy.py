"""`python -m infra.sagemaker.deploy deploy|delete|instance-types ...`: one command per step of a SageMaker
endpoint's life, with boto3.

deploy  packages model.tar.gz (weights, optional kernel-cache blob, optional script-mode code/) or takes
        --model-data s3://..., uploads it, creates a model and a new endpoint config, then creates the
        endpoint or updates it in place to the new config (SageMaker swaps instances without downtime),
        waits with a progress line, and (with --max-instances) registers target-tracking autoscaling at
        TARGET_SHARE of the instance's streams unless --target-concurrency says: on the high-resolution
        concurrent requests per model (one model per instance), or with --async-output (an asynchronous-
        inference endpoint) on the backlog per instance. --scale-to-zero lets it scale to 0 instances and
        wakes it with a CloudWatch alarm: an async endpoint queues meanwhile; a real-time one then hosts the
        model as an inference component (SageMaker scales real-time endpoints to zero only those) and refuses
        requests until a copy starts (autoscale.py).
delete  the endpoint, its inference component, configs and models (by the name prefix this tool gives them),
        the autoscaling and its alarm.
Idempotent: running deploy again with the same inputs reuses the uploaded archive and updates in place.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import TARGET_SHARE, share_of
from . import autoscale, components, package
from .autoscale import CONCURRENCY_METRIC, SCALE_IN_COOLDOWN_S, SCALE_OUT_COOLDOWN_S  # noqa: F401 - plan, tests
from .autoscale import VARIANT_DIMENSION as SCALABLE_DIMENSION  # noqa: F401
from .components import VARIANT

# The instance types we suggest: (GPUs, GPU, GB per GPU, the engine's memory preset for that GPU:
# ttsengine/engine/presets.py, which a test keeps this table equal to). S1-mini needs (measured on an H100, random
# weights of the real shapes): weights bf16 2.53 GB (LLM 1.75 + codec 0.78), int8 1.57 GB; the engine sizes its
# KV pool from the preset within the GPU's memory share. The image runs one engine per GPU (TTS_DEVICES=auto), so
# a multi-GPU type needs no other setting: expected streams at ~1.2x real time = GPUs x the preset's streams
# (measured on H100 and 2x H200: 256 per GPU; the other presets are scaled by bandwidth and bf16 throughput).
# T4 (ml.g4dn) has no fast bf16: set TTS_DTYPE=float16 there.
INSTANCE_TYPES = {
    "ml.g4dn.xlarge": (1, "T4", 16, "gpu-small", 16),
    "ml.g5.xlarge": (1, "A10G", 24, "a10g", 64), "ml.g5.2xlarge": (1, "A10G", 24, "a10g", 64),
    "ml.g5.12xlarge": (4, "A10G", 24, "a10g", 64), "ml.g5.48xlarge": (8, "A10G", 24, "a10g", 64),
    "ml.g6.xlarge": (1, "L4", 24, "l4", 48), "ml.g6.2xlarge": (1, "L4", 24, "l4", 48),
    "ml.g6.12xlarge": (4, "L4", 24, "l4", 48), "ml.g6.48xlarge": (8, "L4", 24, "l4", 48),
    "ml.g6e.xlarge": (1, "L40S", 48, "l40s", 128), "ml.g6e.12xlarge": (4, "L40S", 48, "l40s", 128),
    "ml.p4d.24xlarge": (8, "A100", 40, "a100-40gb", 128), "ml.p5.48xlarge": (8, "H100", 80, "h100", 256),
}  # instance type -> (GPUs, GPU, GB per GPU, memory preset, streams per GPU at ~1.2x real time)
NEEDS_GB = {"bf16": 2.53, "int8": 1.57}  # weights; plus the KV pool
# Which presets' stream counts were measured (docs/performance.md, "Engine scheduling"); the rest are scaled.
MEASURED_PRESETS = {"h100", "h200"}
# Autoscaling tracks concurrent requests per instance (SageMaker's high-resolution ConcurrentRequestsPerModel:
# one model per instance here; async: the backlog per instance) at TARGET_SHARE of the instance's streams: the
# rest absorbs a burst while a new instance starts (minutes), and past the streams requests queue instead of
# slowing every stream. autoscale.py holds the policies.
MODEL_DOWNLOAD_TIMEOUT_S = 1200
ASYNC_MAX_CONCURRENCY = 1000  # SageMaker's ceiling on MaxConcurrentInvocationsPerInstance


class DeployError(Exception):
    """One line a user can act on."""


@dataclass(frozen=True)
class DeploySpec:
    name: str
    image: str
    role: str
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    bucket: str | None = None
    model_dir: Path | None = None
    model_data: str | None = None  # s3:// URI of an existing model.tar.gz
    code: bool = False
    cache_blob: Path | None = None
    env: dict = field(default_factory=dict)
    startup_timeout_s: int = 1200  # first start compiles unless a kernel-cache blob is shipped
    async_output: str | None = None
    sns_topic: str | None = None
    min_instances: int | None = None  # None: 1, or 0 with scale_to_zero
    max_instances: int = 0  # 0: no autoscaling
    target_concurrency: float | None = None  # concurrent requests per instance; None: target_concurrency(type)
    scale_in: bool = True
    codec_cache: Path | None = None  # weights/codec-KEY.pt from the warm run that made cache_blob
    scale_to_zero: bool = False  # real-time: as an inference component; async: the variant's floor is 0

    @property
    def components(self) -> bool:
        """The model is an inference component: a real-time endpoint that may scale to zero."""
        return self.scale_to_zero and not self.async_output


def _clients(region: str | None, session=None):
    import boto3

    session = session or boto3.session.Session(region_name=region)
    if not session.region_name:
        raise DeployError("no AWS region: pass --region or set AWS_DEFAULT_REGION")
    return (session.client("s3"), session.client("sagemaker"), session.client("application-autoscaling"),
            session.client("cloudwatch"))


def _aws_error(e: Exception, what: str) -> DeployError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    message = getattr(e, "response", {}).get("Error", {}).get("Message", str(e))
    hints = {"AccessDeniedException": "the credentials lack the SageMaker permissions",
             "ResourceLimitExceeded": "an account quota is exhausted: ask AWS for more of this instance type",
             "ValidationException": "a parameter was rejected"}
    hint = next((h for k, h in hints.items() if k in code), "")
    return DeployError(f"{what}: {code}: {message}" + (f" ({hint})" if hint else ""))


def model_archive(spec: DeploySpec, s3) -> str:
    """-> the s3:// URI of model.tar.gz (uploaded once per content hash)."""
    if spec.model_data:
        return spec.model_data
    if not spec.bucket or spec.model_dir is None:
        raise DeployError("give --model-data s3://..., or --model-dir with --bucket")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "model.tar.gz"
        try:
            package.build(spec.model_dir, archive, spec.code, spec.cache_blob, spec.codec_cache)
        except SystemExit as e:
            raise DeployError(str(e)) from None
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
        key = f"{spec.name}/model-{digest}.tar.gz"
        try:
            s3.head_object(Bucket=spec.bucket, Key=key)
            print(f"deploy: s3://{spec.bucket}/{key} already uploaded")
        except Exception:  # noqa: BLE001 - absent (404) or unreadable: upload
            try:
                s3.upload_file(str(archive), spec.bucket, key)
            except Exception as e:  # noqa: BLE001
                raise _aws_error(e, f"upload to s3://{spec.bucket}/{key}") from None
            print(f"deploy: uploaded s3://{spec.bucket}/{key} ({archive.stat().st_size / 1e6:.1f} MB)")
    return f"s3://{spec.bucket}/{key}"


def check(spec: DeploySpec) -> None:
    """The combinations that cannot work, as one line each (before anything is created)."""
    floor = spec.min_instances
    if spec.scale_to_zero:
        if spec.max_instances < 1:
            raise DeployError("--scale-to-zero needs --max-instances N: the most instances it scales back up to")
        if floor not in (None, 0):
            raise DeployError("--scale-to-zero scales down to 0 instances: drop --min-instances")
        if not spec.scale_in:
            raise DeployError("--scale-to-zero and --no-scale-in contradict: it reaches zero by scaling in")
        if spec.components and spec.instance_type not in INSTANCE_TYPES:
            raise DeployError(f"--scale-to-zero gives the model all of an instance's GPUs: {spec.instance_type} is "
                              "not in the instance table (`instance-types`)")
    elif floor == 0:
        raise DeployError("--min-instances 0 needs --scale-to-zero: the alarm that adds an instance when a request "
                          "finds none")
    if spec.max_instances and floor is not None and floor > spec.max_instances:
        raise DeployError(f"--min-instances {floor} is above --max-instances {spec.max_instances}")
    if spec.max_instances:
        scaling(spec)  # a type outside the table needs --target-concurrency: say so before creating anything


def endpoint_config(spec: DeploySpec, config_name: str, model_name: str) -> dict:
    """CreateEndpointConfig's arguments (infra/sagemaker/endpoint.yaml's EndpointConfig, tested equal)."""
    if spec.components:  # the endpoint holds no model: the inference component brings it
        variant = components.variant(spec.instance_type, spec.instance_count, spec.max_instances)
        return {"EndpointConfigName": config_name, "ExecutionRoleArn": spec.role, "ProductionVariants": [variant]}
    variant = {"VariantName": VARIANT, "ModelName": model_name, "InstanceType": spec.instance_type,
               "InitialInstanceCount": spec.instance_count,
               "ContainerStartupHealthCheckTimeoutInSeconds": spec.startup_timeout_s,
               "ModelDataDownloadTimeoutInSeconds": MODEL_DOWNLOAD_TIMEOUT_S}
    config = {"EndpointConfigName": config_name, "ProductionVariants": [variant]}
    if spec.async_output:
        output = {"S3OutputPath": spec.async_output}
        if spec.sns_topic:
            output["NotificationConfig"] = {"SuccessTopic": spec.sns_topic, "ErrorTopic": spec.sns_topic}
        # Up to the instance's streams at once: past them requests wait in SageMaker's queue (the backlog
        # autoscaling tracks) rather than inside the engine.
        config["AsyncInferenceConfig"] = {"OutputConfig": output, "ClientConfig": {
            "MaxConcurrentInvocationsPerInstance": async_concurrency(spec.instance_type)}}
    return config


def async_concurrency(instance_type: str) -> int:
    if instance_type not in INSTANCE_TYPES:
        return 64
    gpus, *_, streams = INSTANCE_TYPES[instance_type]
    return min(gpus * streams, ASYNC_MAX_CONCURRENCY)


def component_spec(spec: DeploySpec, model_name: str) -> dict:
    gpus = INSTANCE_TYPES[spec.instance_type][0]
    return components.specification(model_name, gpus, spec.startup_timeout_s, MODEL_DOWNLOAD_TIMEOUT_S)


def scaling(spec: DeploySpec) -> autoscale.Scaling:
    mode = autoscale.ASYNC if spec.async_output else autoscale.COMPONENTS if spec.components else autoscale.REALTIME
    floor = 0 if spec.scale_to_zero else (1 if spec.min_instances is None else spec.min_instances)
    # async: the backlog an instance can run at once is capped (ASYNC_MAX_CONCURRENCY): its share of that, not of
    # the streams (a p5's 65% of 2,048 streams would sit above the 1,000 it may run, and scale out only past them)
    table = share_of(async_concurrency(spec.instance_type)) if mode == autoscale.ASYNC else None
    target = spec.target_concurrency or table or target_concurrency(spec.instance_type)
    return autoscale.Scaling(spec.name, mode, floor, spec.max_instances, float(target), spec.scale_in)


def deploy(spec: DeploySpec, region: str | None = None, wait: bool = True, poll_s: float = 15, session=None) -> dict:
    check(spec)
    if spec.instance_type not in INSTANCE_TYPES:
        print(f"deploy: note: {spec.instance_type} is not in the tested table ({', '.join(INSTANCE_TYPES)})")
    s3, sm, aas, cw = _clients(region, session)
    exists = _endpoint_status(sm, spec.name) is not None
    if exists and components.hosted(sm, spec.name) != spec.components:
        now = ("holds its model on its instances; a real-time endpoint scales to zero only as an inference "
               "component" if spec.components else "hosts an inference component (real-time --scale-to-zero)")
        raise DeployError(f"endpoint {spec.name} {now}, and an update cannot switch that: delete it first "
                          f"(python -m infra.sagemaker.deploy delete --name {spec.name}) or use another --name")
    data = model_archive(spec, s3)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model_name, config_name = f"{spec.name}-{stamp}", f"{spec.name}-{stamp}"
    env = dict(spec.env)
    if spec.cache_blob is not None or spec.codec_cache is not None:
        env.setdefault("TTS_CACHE_DIR", "/opt/ml/model/kernel-cache")
    try:
        sm.create_model(ModelName=model_name, ExecutionRoleArn=spec.role,
                        PrimaryContainer={"Image": spec.image, "ModelDataUrl": data, "Environment": env})
        sm.create_endpoint_config(**endpoint_config(spec, config_name, model_name))
        if not exists:
            sm.create_endpoint(EndpointName=spec.name, EndpointConfigName=config_name)
            action = "creating"
        else:
            sm.update_endpoint(EndpointName=spec.name, EndpointConfigName=config_name)
            action = "updating"
    except DeployError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore's ClientError and friends
        raise _aws_error(e, f"deploy {spec.name}") from None
    print(f"deploy: {action} endpoint {spec.name} with config {config_name} ({spec.instance_type} x"
          f"{spec.instance_count})")
    result = {"endpoint": spec.name, "config": config_name, "model": model_name, "model_data": data}
    if spec.components:  # a component goes onto an endpoint in service: this waits for it even with --no-wait
        status = wait_in_service(sm, spec.name, poll_s)
        result["component"] = name = components.component_name(spec.name)
        try:
            action = components.put(sm, spec.name, component_spec(spec, model_name), spec.instance_count)
        except Exception as e:  # noqa: BLE001
            raise _aws_error(e, f"inference component {name}") from None
        print(f"deploy: {action} inference component {name} with model {model_name}")
        if wait:
            _wait(lambda: sm.describe_inference_component(InferenceComponentName=name), "InferenceComponentStatus",
                  f"inference component {name}", poll_s)
    else:
        status = wait_in_service(sm, spec.name, poll_s) if wait else _endpoint_status(sm, spec.name)
    if spec.max_instances:
        plan = scaling(spec)
        autoscale.apply(aas, cw, plan)
        print(f"deploy: {plan.describe()}")
    return {**result, "status": status}


def _endpoint_status(sm, name: str) -> str | None:
    return components.described(sm.describe_endpoint, "EndpointStatus", EndpointName=name)


def wait_in_service(sm, name: str, poll_s: float, timeout_s: float = 3600) -> str:
    return _wait(lambda: sm.describe_endpoint(EndpointName=name), "EndpointStatus", f"endpoint {name}", poll_s,
                 timeout_s, f" (CloudWatch log group /aws/sagemaker/Endpoints/{name})")


def _wait(describe, key: str, what: str, poll_s: float, timeout_s: float = 3600, logs: str = "") -> str:
    start = time.time()
    while True:
        desc = describe()
        status = desc[key]
        print(f"\rdeploy: {what}: {status} ({time.time() - start:.0f} s)", end="", flush=True)
        if status == "InService":
            print()
            return status
        if status == "Failed":
            print()
            raise DeployError(f"{what} failed: {desc.get('FailureReason', 'no reason given')}{logs}")
        if time.time() - start > timeout_s:
            print()
            raise DeployError(f"{what} still {status} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def target_concurrency(instance_type: str) -> int:
    """Concurrent requests per instance to track: TARGET_SHARE of its streams (GPUs x the preset's streams)."""
    if instance_type not in INSTANCE_TYPES:
        raise DeployError(f"{instance_type} is not in the instance table: pass --target-concurrency N "
                          f"(about {TARGET_SHARE:.0%} of the streams it serves)")
    gpus, _, _, _, streams = INSTANCE_TYPES[instance_type]
    return share_of(gpus * streams)


def delete(name: str, region: str | None = None, session=None, poll_s: float = 5) -> list[str]:
    """-> what was deleted. Safe to run twice."""
    _, sm, aas, cw = _clients(region, session)
    gone = autoscale.remove(aas, cw, name)
    if _endpoint_status(sm, name) is not None:
        if components.hosted(sm, name):
            gone += components.delete_all(sm, name, poll_s)
        sm.delete_endpoint(EndpointName=name)
        gone.append(f"endpoint {name}")
    for config in sm.list_endpoint_configs(NameContains=name)["EndpointConfigs"]:
        if config["EndpointConfigName"].startswith(f"{name}-"):
            sm.delete_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
            gone.append(f"endpoint config {config['EndpointConfigName']}")
    for model in sm.list_models(NameContains=name)["Models"]:
        if model["ModelName"].startswith(f"{name}-"):
            sm.delete_model(ModelName=model["ModelName"])
            gone.append(f"model {model['ModelName']}")
    return gone


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.sagemaker.deploy", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deploy", help="create or update an endpoint")
    d.add_argument("--name", required=True)
    d.add_argument("--image", required=True, help="ECR image URI (python -m infra.sagemaker.ecr builds and pushes it)")
    d.add_argument("--role", required=True, help="SageMaker execution role ARN")
    d.add_argument("--model-dir", type=Path)
    d.add_argument("--model-data", help="an existing s3://.../model.tar.gz instead of --model-dir")
    d.add_argument("--bucket", help="where model.tar.gz is uploaded")
    d.add_argument("--code", action="store_true", help="add script-mode code/ (AWS PyTorch containers)")
    d.add_argument("--cache-blob", type=Path, help="kernel-cache blob from `python -m ttsengine warm`")
    d.add_argument("--codec-cache", type=Path, help="weights/codec-KEY.pt from the cache dir of the same warm run")
    d.add_argument("--instance-type", default="ml.g5.xlarge")
    d.add_argument("--instance-count", type=int, default=1)
    d.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container environment")
    d.add_argument("--startup-timeout", type=int, default=1200, help="ContainerStartupHealthCheckTimeoutInSeconds")
    d.add_argument("--async-output", help="s3:// prefix: an asynchronous-inference endpoint")
    d.add_argument("--sns-topic", help="SNS topic ARN notified when async results land")
    d.add_argument("--min-instances", type=int, help="autoscaling's floor (default 1; 0 is --scale-to-zero)")
    d.add_argument("--max-instances", type=int, default=0, help="> 0 enables autoscaling")
    d.add_argument("--scale-to-zero", action="store_true",
                   help="scale to 0 instances when idle (needs --max-instances); an alarm adds one when a request "
                        "comes: async requests queue meanwhile, real-time ones fail until a copy starts (minutes)")
    d.add_argument("--target-concurrency", type=float,
                   help="concurrent requests per instance to track; async: requests queued or in flight per "
                        f"instance (default: {TARGET_SHARE:.0%} of its streams)")
    d.add_argument("--target-invocations", type=float, help=argparse.SUPPRESS)  # replaced: says so below
    d.add_argument("--no-scale-in", action="store_true", help="never remove instances automatically")
    d.add_argument("--no-wait", action="store_true",
                   help="return once the endpoint is requested (with --scale-to-zero on a real-time endpoint: in "
                        "service, its inference component requested)")
    x = sub.add_parser("delete", help="delete the endpoint, its component, configs, models, autoscaling, alarm")
    x.add_argument("--name", required=True)
    sub.add_parser("instance-types", help="the GPU instance table")
    for p in (d, x):
        p.add_argument("--region")
    args = ap.parse_args(argv)
    try:
        if args.command == "instance-types":
            print(f"{'instance':<18} {'GPUs':>4} {'GPU':<6} {'VRAM/GPU':>8}  {'preset':<10} {'streams':>7} "
                  f"{'target':>6}  {'source':<8} (one engine per GPU; streams at ~1.2x real time; target: "
                  f"{TARGET_SHARE:.0%} of them, concurrent requests; weights bf16 {NEEDS_GB['bf16']} GB, int8 "
                  f"{NEEDS_GB['int8']} GB)")
            for name, (gpus, gpu, gb, preset, streams) in INSTANCE_TYPES.items():
                source = "measured" if preset in MEASURED_PRESETS else "preset"
                print(f"{name:<18} {gpus:>4} {gpu:<6} {gb:>5} GB  {preset:<10} {gpus * streams:>7} "
                      f"{target_concurrency(name):>6}  {source}")
            return 0
        if args.command == "delete":
            for item in delete(args.name, args.region) or ["nothing to delete"]:
                print(f"delete: {item}")
            return 0
        if args.target_invocations is not None:
            raise DeployError("--target-invocations is gone: the endpoint scales on concurrent requests per "
                              f"instance; --target-concurrency N (default {TARGET_SHARE:.0%} of the instance's "
                              "streams, `instance-types` lists them)")
        env = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise DeployError(f"--env {item!r}: expected KEY=VALUE")
            env[key] = value
        spec = DeploySpec(args.name, args.image, args.role, args.instance_type, args.instance_count, args.bucket,
                          args.model_dir, args.model_data, args.code, args.cache_blob, env, args.startup_timeout,
                          args.async_output, args.sns_topic, min_instances=args.min_instances,
                          max_instances=args.max_instances, target_concurrency=args.target_concurrency,
                          scale_in=not args.no_scale_in, codec_cache=args.codec_cache,
                          scale_to_zero=args.scale_to_zero)
        result = deploy(spec, args.region, wait=not args.no_wait)
        print(f"deploy: {result['endpoint']} {result['status']}")
        return 0
    except DeployError as e:
        print(f"deploy: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - botocore errors (credentials, network, service): one line
        if type(e).__module__.split(".")[0] not in ("botocore", "boto3"):
            raise
        print(f"deploy: {_aws_error(e, args.command)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
