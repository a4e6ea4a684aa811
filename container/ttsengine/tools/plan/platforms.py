"""Each platform's autoscaling policy, with the numbers the deploy tools in infra/ use (read from there, not
copied): SageMaker's target share and cooldowns (infra/sagemaker/deploy.py), RunPod's request-count rule and
idle timeout (infra/runpod/), KEDA's threshold and HPA behaviour (infra/kubernetes/base/scaledobject.yaml).
infra/ is deploy-time code beside the image, not in it: plan runs from a checkout."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...errors import TTSError
from .policy import Policy

# AWS target tracking: the scale-in alarm wants 15 one-minute datapoints below target (AWS's documented rule,
# not a setting of ours); scale-out follows the high-resolution metric within the minute step.
SAGEMAKER_SCALE_IN_ALARM_S = 15 * 60


def _infra():
    try:
        from infra.runpod import deploy as runpod_deploy
        from infra.sagemaker import deploy as sagemaker_deploy
    except ImportError as e:
        raise TTSError(f"plan reads the platforms' scaling settings from the repository's infra/ ({e}): run it "
                       "from a checkout, with the checkout on PYTHONPATH") from None
    return sagemaker_deploy, runpod_deploy


def sagemaker(streams: int) -> Policy:
    sm, _ = _infra()
    target = sm.share_of(streams)
    return Policy("sagemaker", target,
                  {"TargetValue": target, "metric": sm.CONCURRENCY_METRIC, "ScaleOutCooldown": sm.SCALE_OUT_COOLDOWN_S,
                   "ScaleInCooldown": sm.SCALE_IN_COOLDOWN_S,
                   "deploy": f"--target-concurrency {target} (TargetConcurrencyPerInstance in endpoint.yaml)"},
                  out_cooldown_s=sm.SCALE_OUT_COOLDOWN_S, in_cooldown_s=sm.SCALE_IN_COOLDOWN_S,
                  in_window_s=SAGEMAKER_SCALE_IN_ALARM_S,
                  source=f"infra/sagemaker/deploy.py: {sm.TARGET_SHARE:.0%} of the instance's streams")


def runpod(streams: int) -> Policy:
    """REQUEST_COUNT keeps (jobs queued + running) / scalerValue workers; scalerValue "auto" (the shipped spec) is
    TARGET_SHARE of the worker's streams, as deploy.py resolves it: a new worker starts while the running ones still
    have room. A number in the spec is taken as it is. An idle worker stops after idleTimeout."""
    _, rp = _infra()
    try:
        endpoint = json.loads(rp.SPEC.read_text())["endpoint"]
    except (OSError, ValueError, KeyError) as e:
        raise TTSError(f"{rp.SPEC}: {e}") from None
    idle = float(endpoint["idleTimeout"])
    configured = endpoint["scalerValue"]
    value = rp.share_of(streams) if configured == "auto" else min(int(configured), streams)
    how = f"auto: {rp.TARGET_SHARE:.0%} of the worker's streams" if configured == "auto" else "as set in the spec"
    return Policy("runpod", value,
                  {"scalerType": "REQUEST_COUNT", "scalerValue": value, "RUNPOD_CONCURRENCY": streams,
                   "idleTimeout": endpoint["idleTimeout"]},
                  in_window_s=max(60.0, idle), min_instances=max(1, int(endpoint["workersMin"])),
                  source=f"infra/runpod/endpoint.json ({how}), deploy.resolve_scaler_value")


def keda(slots: int, scaled_object: Path | None = None) -> Policy:
    """The HPA KEDA makes wants ceil(replicas x ratio / threshold), the ratio being streams (running + waiting)
    over the pods' slots (tts_max_streams: each pod's memory preset, or TTS_MAX_BATCH)."""
    import yaml

    path = scaled_object or Path(__file__).resolve().parents[4] / "infra" / "kubernetes" / "base" / "scaledobject.yaml"
    try:
        spec = yaml.safe_load(path.read_text())["spec"]
        threshold = float(spec["triggers"][0]["metadata"]["threshold"])
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        up, down = behavior["scaleUp"]["policies"][0], behavior["scaleDown"]["policies"][0]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as e:
        raise TTSError(f"{path}: {e}") from None
    target = threshold * slots
    return Policy("kubernetes", target,
                  {"threshold": spec["triggers"][0]["metadata"]["threshold"], "streams_per_pod": round(target, 1),
                   "scaleUp": f"{up['value']} pods per {up['periodSeconds']} s",
                   "scaleDown": f"{down['value']} pod per {down['periodSeconds']} s after "
                                f"{behavior['scaleDown']['stabilizationWindowSeconds']} s"},
                  out_cooldown_s=float(up["periodSeconds"]), out_step=int(up["value"]),
                  in_cooldown_s=float(down["periodSeconds"]), in_step=int(down["value"]),
                  in_window_s=float(behavior["scaleDown"]["stabilizationWindowSeconds"]),
                  min_instances=int(spec.get("minReplicaCount", 1)),
                  source=f"infra/kubernetes/base/scaledobject.yaml: ratio of slots in use, threshold {threshold:g}")


def all_policies(streams: int, slots: int) -> list[Policy]:
    return [sagemaker(streams), runpod(streams), keda(slots)]


def peak_instances(policy: Policy, sized_peak: float) -> int:
    return max(policy.min_instances, math.ceil(sized_peak / policy.target - 1e-9))


def preset_basis(preset_name: str) -> str:
    """Whether a preset's streams were measured on its GPU or scaled from another (infra's table says)."""
    sm, _ = _infra()
    return "measured on this GPU" if preset_name in sm.MEASURED_PRESETS else "scaled by bandwidth and bf16 throughput"
