"""Autoscaling of a SageMaker endpoint in the three modes `python -m infra.sagemaker.deploy` makes, with boto3
(Application Auto Scaling and CloudWatch); infra/sagemaker/endpoint.yaml declares the same resources.

realtime    one model per instance; target tracking on the high-resolution concurrent requests per model.
async       target tracking on the queue (ApproximateBacklogSizePerInstance); with scale to zero the floor is 0
            and a CloudWatch alarm on HasBacklogWithoutCapacity adds the first instance when a request queues.
components  a real-time endpoint at zero: SageMaker scales a real-time endpoint to zero instances only when it
            hosts inference components, so the model is one (one copy per instance, holding all its GPUs) on
            an endpoint whose instances SageMaker manages (0..max); target tracking on concurrent requests per
            copy, and an alarm on NoCapacityInvocationFailures adds the first copy when a request finds none.

AWS's recipes, which the numbers below follow except where a comment says why not:
"Autoscale an asynchronous endpoint" https://docs.aws.amazon.com/sagemaker/latest/dg/async-inference-autoscale.html
"Scale an endpoint to zero instances"
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html
"""

from __future__ import annotations

from dataclasses import dataclass

from .components import VARIANT, component_name

REALTIME, ASYNC, COMPONENTS = "realtime", "async", "components"
VARIANT_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
# Real-time: concurrent requests per instance (one model per instance here), high resolution (10 s).
CONCURRENCY_METRIC = "SageMakerVariantConcurrentRequestsPerModelHighResolution"
# Inference components: the same per copy; a copy holds a whole instance, so per copy is per instance.
COPY_CONCURRENCY_METRIC = "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
# Async: the concurrency metrics count only synchronous requests. The backlog counts the requests queued or in
# flight at the endpoint, per instance; an instance takes up to its streams at once (the endpoint config's
# MaxConcurrentInvocationsPerInstance), so a backlog per instance of TARGET_SHARE of its streams asks what the
# real-time target asks: each instance busy at that share, the rest of its streams free for the burst that
# arrives while another instance starts. Past the streams the requests wait in SageMaker's queue, not in the
# engine, and count toward the backlog that scales the endpoint out.
BACKLOG_METRIC = "ApproximateBacklogSizePerInstance"
SCALE_IN_COOLDOWN_S = 600  # streams last minutes and each instance drains; a removed instance costs a warm start
SCALE_OUT_COOLDOWN_S = 60
# Waking from zero. The alarm invokes its scaling policy every minute it stays in ALARM, and a request keeps
# it there until the first instance (or copy) serves: minutes (an instance, the image, the model, the warm-up).
# AWS's inference-component recipe waits 60 s between steps, which would add a copy a minute meanwhile; its async
# recipe's 300 s holds it near one. Target tracking adds the rest once the first one reports load.
WAKE_COOLDOWN_S = 300


@dataclass(frozen=True)
class Scaling:
    """How one endpoint scales: built by infra.sagemaker.deploy.scaling() from its DeploySpec."""

    endpoint: str
    mode: str  # REALTIME | ASYNC | COMPONENTS
    min: int  # instances (copies for COMPONENTS); 0 = scale to zero
    max: int
    target: float  # concurrent requests (async: queued + in flight) per instance, or per copy
    scale_in: bool = True

    @property
    def wake(self) -> bool:
        """At zero nothing reports load, so target tracking cannot leave it: an alarm adds the first one."""
        return self.min == 0

    @property
    def resource(self) -> str:
        if self.mode == COMPONENTS:
            return f"inference-component/{component_name(self.endpoint)}"
        return f"endpoint/{self.endpoint}/variant/{VARIANT}"

    @property
    def dimension(self) -> str:
        return COPY_DIMENSION if self.mode == COMPONENTS else VARIANT_DIMENSION

    @property
    def tracking_name(self) -> str:
        return f"{self.endpoint}-backlog" if self.mode == ASYNC else f"{self.endpoint}-concurrency"

    @property
    def wake_name(self) -> str:  # the step policy and its alarm
        return wake_name(self.endpoint)

    def target_registration(self) -> dict:
        return {"ServiceNamespace": "sagemaker", "ResourceId": self.resource, "ScalableDimension": self.dimension,
                "MinCapacity": self.min, "MaxCapacity": self.max}

    def tracking(self) -> dict:
        """TargetTrackingScalingPolicyConfiguration."""
        if self.mode == ASYNC:
            metric = {"CustomizedMetricSpecification": {
                "MetricName": BACKLOG_METRIC, "Namespace": "AWS/SageMaker",
                "Dimensions": [{"Name": "EndpointName", "Value": self.endpoint}], "Statistic": "Average"}}
        else:
            kind = COPY_CONCURRENCY_METRIC if self.mode == COMPONENTS else CONCURRENCY_METRIC
            metric = {"PredefinedMetricSpecification": {"PredefinedMetricType": kind}}
        return {"TargetValue": float(self.target), **metric, "ScaleInCooldown": SCALE_IN_COOLDOWN_S,
                "ScaleOutCooldown": SCALE_OUT_COOLDOWN_S, "DisableScaleIn": not self.scale_in}

    def step(self) -> dict:
        """StepScalingPolicyConfiguration: one more instance (copy) whenever the alarm fires."""
        return {"AdjustmentType": "ChangeInCapacity", "Cooldown": WAKE_COOLDOWN_S,
                "MetricAggregationType": "Average" if self.mode == ASYNC else "Maximum",
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}

    def alarm(self, policy_arn: str) -> dict:
        """put_metric_alarm's arguments: the alarm that wakes the endpoint from zero."""
        if self.mode == ASYNC:
            # 1 while requests wait and no instance runs. AWS's example waits two 1-minute periods; the metric
            # is 1 only in exactly the case to act on, so one period wakes the endpoint a minute sooner.
            metric = {"MetricName": "HasBacklogWithoutCapacity", "Statistic": "Average",
                      "Dimensions": [{"Name": "EndpointName", "Value": self.endpoint}],
                      "AlarmDescription": "a request queued at zero instances: add one"}
        else:
            # Requests refused for want of a copy. AWS's example alarms when the minute's Sum is > 1 (a second
            # failure); >= 1 wakes the endpoint on the first refused request.
            metric = {"MetricName": "NoCapacityInvocationFailures", "Statistic": "Sum",
                      "Dimensions": [{"Name": "InferenceComponentName", "Value": component_name(self.endpoint)}],
                      "AlarmDescription": "a request found no copy of the model: add one"}
        # No data point means no request went unserved.
        return {"AlarmName": self.wake_name, "AlarmActions": [policy_arn], "Namespace": "AWS/SageMaker", **metric,
                "Period": 60, "EvaluationPeriods": 1, "DatapointsToAlarm": 1, "Threshold": 1.0,
                "ComparisonOperator": "GreaterThanOrEqualToThreshold", "TreatMissingData": "notBreaching"}

    def describe(self) -> str:
        unit = {REALTIME: "concurrent requests/instance", ASYNC: "queued + in-flight requests/instance",
                COMPONENTS: "concurrent requests/copy, one copy per instance"}[self.mode]
        what = "copies" if self.mode == COMPONENTS else "instances"
        return (f"autoscaling {self.min}..{self.max} {what} at {self.target:g} {unit}"
                + (f", woken from zero by alarm {self.wake_name}" if self.wake else "")
                + ("" if self.scale_in else ", scale-in disabled"))


def wake_name(endpoint: str) -> str:
    return f"{endpoint}-scale-from-zero"


def apply(aas, cw, s: Scaling) -> None:
    """Register the scalable target and put its policies (and the wake alarm); remove the ones this tool put
    there before that this mode does not use (a redeploy from async with scale to zero to async without)."""
    aas.register_scalable_target(**s.target_registration())
    common = {"ServiceNamespace": "sagemaker", "ResourceId": s.resource, "ScalableDimension": s.dimension}
    aas.put_scaling_policy(PolicyName=s.tracking_name, PolicyType="TargetTrackingScaling",
                           TargetTrackingScalingPolicyConfiguration=s.tracking(), **common)
    keep = {s.tracking_name}
    if s.wake:
        arn = aas.put_scaling_policy(PolicyName=s.wake_name, PolicyType="StepScaling",
                                     StepScalingPolicyConfiguration=s.step(), **common)["PolicyARN"]
        cw.put_metric_alarm(**s.alarm(arn))
        keep.add(s.wake_name)
    else:
        delete_alarm(cw, s.wake_name)
    delete_policies(aas, s.endpoint, s.resource, s.dimension, keep)


def delete_policies(aas, endpoint: str, resource: str, dimension: str, keep=frozenset()) -> list[str]:
    """This tool's policies (named ENDPOINT-...) on one scalable target, but those in keep."""
    gone = []
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)["ScalingPolicies"]
    for p in policies:
        ours = p["PolicyName"].startswith(f"{endpoint}-") and p["PolicyName"] not in keep
        if ours and (p["ResourceId"], p["ScalableDimension"]) == (resource, dimension):
            aas.delete_scaling_policy(PolicyName=p["PolicyName"], ServiceNamespace="sagemaker", ResourceId=resource,
                                      ScalableDimension=dimension)
            gone.append(f"scaling policy {p['PolicyName']}")
    return gone


def delete_alarm(cw, name: str) -> list[str]:
    if not cw.describe_alarms(AlarmNames=[name])["MetricAlarms"]:
        return []
    cw.delete_alarms(AlarmNames=[name])
    return [f"alarm {name}"]


def remove(aas, cw, endpoint: str) -> list[str]:
    """-> what was removed: the wake alarm, then on the variant and on the inference component the policies and
    the scalable target. Safe to run twice."""
    gone = delete_alarm(cw, wake_name(endpoint))
    for resource, dimension in ((f"endpoint/{endpoint}/variant/{VARIANT}", VARIANT_DIMENSION),
                                (f"inference-component/{component_name(endpoint)}", COPY_DIMENSION)):
        gone += delete_policies(aas, endpoint, resource, dimension)  # deregistering drops them too; this names them
        try:
            aas.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource,
                                           ScalableDimension=dimension)
            gone.append(f"autoscaling {resource}")
        except Exception:  # noqa: BLE001 - none registered
            pass
    return gone
