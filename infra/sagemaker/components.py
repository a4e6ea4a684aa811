"""The inference component of a real-time endpoint that scales to zero (deploy --scale-to-zero without
--async-output). SageMaker scales a real-time endpoint to zero instances only when it hosts inference components
("Scale an endpoint to zero instances",
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html): the endpoint's
variant then has no model, SageMaker manages its instances (0..max), and the model is a component whose copies
autoscale.py scales. One copy holds all of an instance's GPUs, so copies and instances go together."""

from __future__ import annotations

import time

VARIANT = "AllTraffic"
# A copy's memory reservation per GPU (one engine process per GPU). It places the copy; it is not a cap. Not
# measured: the bf16 weights (2.5 GB) pass through host memory while loading, plus torch's runtime; the smallest
# instance in deploy's table has 16 GiB.
COPY_MEMORY_MB_PER_GPU = 4096


def component_name(endpoint: str) -> str:
    return f"{endpoint}-tts"


def variant(instance_type: str, count: int, max_instances: int) -> dict:
    """The endpoint config's production variant: no model of its own (the component brings it, with its
    start-up timeouts); SageMaker adds and removes instances between 0 and max as copies need them."""
    return {"VariantName": VARIANT, "InstanceType": instance_type, "InitialInstanceCount": count,
            "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": max_instances},
            # to the copy with the fewest requests in flight: streams differ in length by minutes
            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}}


def specification(model_name: str, gpus: int, startup_timeout_s: int, download_timeout_s: int) -> dict:
    """The component's Specification: all the instance's GPUs (the image runs one engine per GPU it sees)."""
    return {"ModelName": model_name,
            "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": gpus,
                                            "MinMemoryRequiredInMb": COPY_MEMORY_MB_PER_GPU * gpus},
            "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": startup_timeout_s,
                                  "ModelDataDownloadTimeoutInSeconds": download_timeout_s}}


def described(describe, field: str, **name) -> str | None:
    """describe(**name)[field] (an endpoint's or a component's status), or None when SageMaker has no such thing."""
    try:
        return describe(**name)[field]
    except Exception as e:  # noqa: BLE001
        if "Could not find" in str(e) or "ValidationException" in str(e):
            return None
        raise


def status(sm, name: str) -> str | None:
    return described(sm.describe_inference_component, "InferenceComponentStatus", InferenceComponentName=name)


def put(sm, endpoint: str, spec: dict, copies: int) -> str:
    """Create the component, or point it at a new model. -> "creating" | "updating"."""
    name = component_name(endpoint)
    if status(sm, name) is None:
        sm.create_inference_component(InferenceComponentName=name, EndpointName=endpoint, VariantName=VARIANT,
                                      Specification=spec, RuntimeConfig={"CopyCount": copies})
        return "creating"
    # No RuntimeConfig: the copy count is autoscaling's, and naming one here would reset it.
    sm.update_inference_component(InferenceComponentName=name, Specification=spec)
    return "updating"


def hosted(sm, endpoint: str) -> bool:
    """Whether the endpoint's variant has no model of its own: it hosts inference components."""
    config = sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
    variants = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"]
    return not any(v.get("ModelName") for v in variants)


def delete_all(sm, endpoint: str, poll_s: float, timeout_s: float = 900) -> list[str]:
    """Delete the endpoint's components and wait until they are gone: the endpoint is deleted after them."""
    gone = []
    for c in sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"]:
        sm.delete_inference_component(InferenceComponentName=c["InferenceComponentName"])
        gone.append(c["InferenceComponentName"])
    start = time.time()
    while any(status(sm, name) is not None for name in gone) and time.time() - start < timeout_s:
        time.sleep(poll_s)
    return [f"inference component {name}" for name in gone]
