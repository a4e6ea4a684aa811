"""infra/kubernetes: the base and the example overlay render without kustomize, every built-in object validates
against the Kubernetes API schemas (kubernetes-validate, strict: an unknown field fails), the KEDA ScaledObject
against KEDA's fields, and the settings agree with the server: probe paths, port, drain time, volume paths,
the gauges the autoscaler queries."""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml
from conftest import ROOT, run_cli

from infra import TARGET_SHARE
from infra.kubernetes import render as rd
from ttsengine.config import ENV_VARS, ServerConfig

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency")
metrics = pytest.importorskip("handlers.http.metrics", reason="the http extra (prometheus-client)")

K8S = ROOT / "infra" / "kubernetes"
DIRS = (K8S / "base", K8S / "overlays" / "example")
# the oldest minor still in the main clouds' (extended) support, and the newest the package knows
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())

# KEDA's ScaledObject, the fields these manifests may use (keda.sh/docs/2.17/reference/scaledobject-spec/ and
# keda.sh/docs/2.17/scalers/prometheus/): KEDA is a CRD, which kubernetes-validate has no schema for. The HPA
# behavior inside it is checked against the Kubernetes schema below, wrapped in an autoscaling/v2 HPA.
_int = {"type": "integer", "minimum": 0}
SCALED_OBJECT = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                                   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                  "name": {"type": "string"},
                                                  "envSourceContainerName": {"type": "string"}}},
                "pollingInterval": _int, "cooldownPeriod": _int, "initialCooldownPeriod": _int,
                "idleReplicaCount": _int, "minReplicaCount": _int, "maxReplicaCount": _int,
                "fallback": {"type": "object", "additionalProperties": False,
                             "required": ["failureThreshold", "replicas"],
                             "properties": {"failureThreshold": _int, "replicas": _int}},
                "advanced": {"type": "object", "additionalProperties": False, "properties": {
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False,
                                                      "properties": {"name": {"type": "string"},
                                                                     "behavior": {"type": "object"}}}}},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["type", "metadata"],
                    "properties": {
                        "type": {"type": "string"}, "name": {"type": "string"},
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        "useCachedMetrics": {"type": "boolean"},
                        "authenticationRef": {"type": "object"},
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "if": {"properties": {"type": {"const": "prometheus"}}},
                    "then": {"properties": {"metadata": {
                        "required": ["serverAddress", "query", "threshold"],
                        "additionalProperties": False,
                        "properties": {k: {"type": "string"} for k in (
                            "serverAddress", "query", "threshold", "activationThreshold", "namespace",
                            "customHeaders", "ignoreNullValues", "queryParameters", "unsafeSsl")}}}},
                }},
            },
        },
    },
}


def _objects(directory):
    return {o["kind"]: o for o in rd.render(directory)}


@pytest.mark.parametrize("directory", DIRS, ids=lambda d: d.name)
def test_manifests_validate_against_the_kubernetes_and_keda_schemas(directory):
    objects = rd.render(directory)
    assert sorted(o["kind"] for o in objects) == sorted(
        ["PersistentVolumeClaim", "Deployment", "Service", "PodDisruptionBudget", "ScaledObject"])
    for obj in objects:
        if obj["kind"] == "ScaledObject":
            jsonschema.validate(obj, SCALED_OBJECT)
            hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
                   "spec": {"scaleTargetRef": obj["spec"]["scaleTargetRef"], "maxReplicas": 2,
                            "behavior": obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]}}
            obj = hpa
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_a_broken_manifest_fails_validation():
    deployment = _objects(K8S / "base")["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("directory", DIRS, ids=lambda d: d.name)
def test_the_deployment_fits_the_server(directory):
    objects = _objects(directory)
    dep = objects["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert set(env) <= set(ENV_VARS), set(env) - set(ENV_VARS)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["args"] == ["http"] and c["ports"][0]["containerPort"] == ServerConfig().port
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"  # 503 while loading, failed or draining
    assert c["livenessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/health"
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 600  # an empty kernel cache compiles for minutes
    # SIGTERM drains for TTS_DRAIN_SECONDS after the preStop wait; the kubelet must not kill before
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + int(env["TTS_DRAIN_SECONDS"])
    # the kernel cache, the voices and the model on the shared claim
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "data"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "data"]
    assert volume["persistentVolumeClaim"]["claimName"] == objects["PersistentVolumeClaim"]["metadata"]["name"]
    for key in ("TTS_CACHE_DIR", "TTS_DATA_DIR", "TTS_MODEL_DIR"):
        assert env[key].startswith(mount["mountPath"] + "/"), key
    assert objects["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]  # every replica mounts it
    # the Service, the budget and the autoscaler point at these pods
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"].items() <= labels.items()
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
    assert objects["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert "replicas" not in dep["spec"]  # the autoscaler owns it


@pytest.mark.parametrize("directory", DIRS, ids=lambda d: d.name)
def test_the_autoscaler_queries_the_servers_stream_gauges(directory):
    so = _objects(directory)["ScaledObject"]
    (trigger,) = so["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    gauges = {name for name, *_ in metrics.ENGINE_GAUGES}
    used = set(re.findall(r"\b(tts_\w+)\{", query))
    assert used == {"tts_active_streams", "tts_queue_depth", "tts_max_streams"} and used <= gauges
    # a ratio of the slots in use, the same target whatever GPU a pod has
    assert trigger["metricType"] == "Value" and float(trigger["metadata"]["threshold"]) == TARGET_SHARE  # as others
    assert set(re.findall(r'namespace="([^"]+)"', query)) == {so["metadata"]["namespace"]}
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    down = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300


def test_render_cli_and_kustomize_subset(tmp_path):
    out = run_cli("infra.kubernetes.render", str(K8S / "overlays" / "example"), "--image", "reg:5000/tts:7")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "reg:5000/tts:7"
    assert dep["spec"]["template"]["spec"]["nodeSelector"]  # the overlay's patch
    overlay = _objects(K8S / "overlays" / "example")
    c = overlay["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith("/fish-tts-server:1") and {e["name"] for e in c["env"]} >= {"TTS_QUANT", "HF_TOKEN"}
    assert overlay["ScaledObject"]["spec"]["maxReplicaCount"] == 16 and overlay["ScaledObject"]["spec"]["triggers"]

    (tmp_path / "kustomization.yaml").write_text("resources: [x.yaml]\nreplicas: [{name: a, count: 2}]\n")
    bad = run_cli("infra.kubernetes.render", str(tmp_path))
    assert bad.returncode == 1 and "replicas not supported" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{K8S / 'base'}]\npatches: [{{path: p.yaml}}]\n")
    (tmp_path / "p.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: nope}\n")
    missing = run_cli("infra.kubernetes.render", str(tmp_path))
    assert missing.returncode == 1 and "Service/nope" in missing.stderr
