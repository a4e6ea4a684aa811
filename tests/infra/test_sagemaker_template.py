"""infra/sagemaker/endpoint.yaml: cfn-lint clean, and the same resources as `python -m infra.sagemaker.deploy` in
each mode (real-time, async, each with and without scale to zero). The template is resolved here for a set of
parameters (conditions, !If, !Ref, !Sub, !FindInMap; resources named as "<Logical.Attribute>") and its
resources compared with the requests deploy.py builds for the same settings; tests/infra/test_sagemaker_deploy.py
checks that deploy() sends exactly those requests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from conftest import ROOT

from infra import share_of
from infra.sagemaker import components
from infra.sagemaker import deploy as dp

TEMPLATE = ROOT / "infra" / "sagemaker" / "endpoint.yaml"
NOVALUE = object()


class _Loader(yaml.SafeLoader):
    pass


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt":
        return {"Fn::GetAtt": value.split(".", 1)}
    return {f"Fn::{suffix}": value}


_Loader.add_multi_constructor("!", _tag)


def load() -> dict:
    return yaml.load(TEMPLATE.read_text(), Loader=_Loader)


class Stack:
    """The template's resources for some parameters, as CloudFormation would resolve them (the subset of
    intrinsic functions the template uses; another one fails here)."""

    def __init__(self, template: dict, **params):
        self.t = template
        self.params = {k: v.get("Default") for k, v in template["Parameters"].items()} | params

    def resources(self) -> dict:
        return {name: (r["Type"], self.resolve(r.get("Properties", {})))
                for name, r in self.t["Resources"].items() if "Condition" not in r or self.cond(r["Condition"])}

    def cond(self, name: str) -> bool:
        return self.test(self.t["Conditions"][name])

    def test(self, node) -> bool:
        ((fn, arg),) = node.items()
        if fn == "Condition":
            return self.cond(arg)
        if fn == "Fn::Equals":
            a, b = (self.resolve(x) for x in arg)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not self.test(arg[0])
        return {"Fn::And": all, "Fn::Or": any}[fn](self.test(x) for x in arg)

    def resolve(self, node):
        if isinstance(node, list):
            return [x for x in (self.resolve(v) for v in node) if x is not NOVALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((fn, arg),) = node.items()
            if fn == "Ref":
                return NOVALUE if arg == "AWS::NoValue" else self.params.get(arg, f"<{arg}>")
            if fn == "Fn::GetAtt":
                return self.getatt(*arg)
            if fn == "Fn::Sub":
                return re.sub(r"\$\{([^}]+)\}", lambda m: str(self.getatt(*m[1].split(".")) if "." in m[1]
                                                               else self.resolve({"Ref": m[1]})), arg)
            if fn == "Fn::If":
                name, then, otherwise = arg
                return self.resolve(then if self.cond(name) else otherwise)
            if fn == "Fn::FindInMap":
                mapping, key, value = (self.resolve(x) for x in arg)
                return self.t["Mappings"][mapping][key][value]
            assert not fn.startswith("Fn::"), f"{fn} is not resolved here"
        return {k: r for k, r in ((k, self.resolve(v)) for k, v in node.items()) if r is not NOVALUE}

    def getatt(self, resource: str, attribute: str):
        if (resource, attribute) == ("Endpoint", "EndpointName"):
            return self.params["EndpointName"]
        return f"<{resource}.{attribute}>"


def _normal(x):
    """CloudFormation's "true"/"false" parameters are the tool's booleans."""
    if isinstance(x, dict):
        return {k: _normal(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_normal(v) for v in x]
    return {"true": True, "false": False}.get(x, x) if isinstance(x, str) else x


def test_cloudformation_template_passes_cfn_lint():
    exe = shutil.which("cfn-lint", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    if exe is None:
        pytest.skip("cfn-lint is a dev dependency")
    proc = subprocess.run([exe, str(TEMPLATE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_template_tables_are_the_tools():
    t = load()
    assert t["Parameters"]["StartupTimeoutSeconds"]["Default"] == dp.DeploySpec.startup_timeout_s
    assert set(t["Parameters"]["InstanceType"]["AllowedValues"]) == set(dp.INSTANCE_TYPES)
    assert t["Mappings"]["InstanceTypes"] == {
        name: {"Target": dp.target_concurrency(name), "Streams": dp.async_concurrency(name),
               "AsyncTarget": share_of(dp.async_concurrency(name)), "Gpus": gpus,
               "CopyMemoryMb": components.COPY_MEMORY_MB_PER_GPU * gpus}
        for name, (gpus, *_) in dp.INSTANCE_TYPES.items()}


MODES = {  # name: (template parameters, the deploy settings that make the same endpoint)
    "realtime": ({}, {}),
    "realtime autoscaled": ({"MaxInstances": 4, "DisableScaleIn": "true"}, {"max_instances": 4, "scale_in": False}),
    "realtime scale to zero": ({"MaxInstances": 4, "ScaleToZero": "true"}, {"max_instances": 4, "scale_to_zero": True}),
    "async": ({"AsyncOutputPath": "s3://b/out/", "MaxInstances": 3, "TargetConcurrencyPerInstance": 50},
              {"async_output": "s3://b/out/", "max_instances": 3, "target_concurrency": 50}),
    "async scale to zero": ({"AsyncOutputPath": "s3://b/out/", "MaxInstances": 3, "ScaleToZero": "true"},
                            {"async_output": "s3://b/out/", "max_instances": 3, "scale_to_zero": True}),
}


@pytest.mark.parametrize("mode", MODES)
def test_template_and_tool_create_the_same_resources(mode):
    params, settings = MODES[mode]
    role = "arn:aws:iam::123456789012:role/tts"
    stack = Stack(load(), EndpointName="fish-tts", InstanceType="ml.g6.12xlarge", ExecutionRoleArn=role, **params)
    spec = dp.DeploySpec("fish-tts", "image", role, instance_type="ml.g6.12xlarge", **settings)
    made = stack.resources()
    by_type: dict[str, list] = {}
    for name, (kind, props) in made.items():
        by_type.setdefault(kind.split("::")[-1], []).append((name, _normal(props)))

    plan = dp.scaling(spec) if spec.max_instances else None
    wake = bool(plan and plan.wake)
    expected = Counter({"Model": 1, "EndpointConfig": 1, "Endpoint": 1, "InferenceComponent": int(spec.components),
                        "ScalableTarget": int(bool(plan)), "ScalingPolicy": (1 + wake) if plan else 0,
                        "Alarm": int(wake)})
    assert Counter({k: len(v) for k, v in by_type.items()}) == +expected

    ((_, config),) = by_type["EndpointConfig"]
    tool_config = dp.endpoint_config(spec, "unnamed", "<Model.ModelName>")
    del tool_config["EndpointConfigName"]
    assert config == tool_config

    if spec.components:
        ((_, component),) = by_type["InferenceComponent"]
        assert component == {"InferenceComponentName": components.component_name("fish-tts"),
                             "EndpointName": "fish-tts", "VariantName": dp.VARIANT,
                             "Specification": dp.component_spec(spec, "<Model.ModelName>"),
                             "RuntimeConfig": {"CopyCount": spec.instance_count}}
    if not plan:
        return
    ((target_id, target),) = by_type["ScalableTarget"]
    assert target == plan.target_registration()
    policies = {props["PolicyName"]: (name, props) for name, props in by_type["ScalingPolicy"]}
    _, tracking = policies[plan.tracking_name]
    assert tracking == {"PolicyName": plan.tracking_name, "PolicyType": "TargetTrackingScaling",
                        "ScalingTargetId": f"<{target_id}>",
                        "TargetTrackingScalingPolicyConfiguration": plan.tracking()}
    if wake:
        step_id, step = policies[plan.wake_name]
        assert step == {"PolicyName": plan.wake_name, "PolicyType": "StepScaling", "ScalingTargetId": f"<{target_id}>",
                        "StepScalingPolicyConfiguration": plan.step()}
        ((_, alarm),) = by_type["Alarm"]
        assert alarm == plan.alarm(f"<{step_id}>")
