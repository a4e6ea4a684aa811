"""Deploy-time tools (SageMaker, RunPod, Kubernetes). Never imported at run time."""

# The share of an instance's (worker's, pod's) streams every autoscaler here aims at: SageMaker's target
# concurrency, RunPod's request-count scalerValue, KEDA's threshold (infra/kubernetes/base/scaledobject.yaml). The
# rest is room for the burst that arrives while a new instance starts: `ttsengine plan` simulated a day at
# 10,000 callers on H200s with RunPod's scalerValue at 100% of a worker's streams and it refused ~6x the requests
# it refused at 65% (docs/scaling.md).
TARGET_SHARE = 0.65


def share_of(streams: int) -> int:
    """TARGET_SHARE of an instance's streams, at least one (SageMaker's target, RunPod's scalerValue, plan's)."""
    return max(1, round(streams * TARGET_SHARE))
