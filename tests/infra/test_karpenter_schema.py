"""Karpenter NodePools: the CRD's openAPIV3Schema (stored with its source), its CEL rules, and
the GPUs the requirements select.

The API server prunes or, with strict field validation, rejects unknown fields; jsonschema
does neither, so every object schema without ``additionalProperties`` is closed here.
The CRD's CEL rules that apply to what gpupool renders are checked explicitly. The GPU
selection is evaluated against instance types' labels as Karpenter's AWS provider publishes
them, and every bad Karpenter setting is a located ``validate`` error with nothing rendered.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from infra.builders.meta import Manifest
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import DEFAULT_POLICY, PoolPolicy, load_policy
from policy.providers import KUBERNETES_IO_ALLOWED
from runtime.cli.app import app
from runtime.vllm import load_model_spec, plan_kv_cache
from tests.infra.policies import edited, explicit_args, policy_with
from tests.infra.test_cli import runner, write_policy
from tests.infra.test_node_safety import yaml_line

SCHEMA_FILE = Path(__file__).parent / "data" / "karpenter_nodepool_v1.schema.yaml"
RESTRICTED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh")
AWS_REQUIREMENT_KEYS = {
    f"karpenter.k8s.aws/{name}"
    for name in (
        "instance-encryption-in-transit-supported",
        "instance-category",
        "instance-hypervisor",
        "instance-family",
        "instance-generation",
        "instance-local-nvme",
        "instance-size",
        "instance-cpu",
        "instance-memory",
        "instance-network-bandwidth",
        "instance-gpu-name",
        "instance-gpu-manufacturer",
        "instance-gpu-count",
        "instance-gpu-memory",
        "instance-accelerator-name",
        "instance-accelerator-manufacturer",
        "instance-accelerator-count",
    )
}
"""The AWS build of the CRD's rule "label domain karpenter.k8s.aws is restricted"."""


def _closed(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and out["properties"]
            and ("additionalProperties" not in out)
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


SCHEMA = _closed(YAML(typ="safe").load(SCHEMA_FILE.read_text()))
# metadata is the standard ObjectMeta (validated by the API server, not by the CRD schema).
SCHEMA["properties"]["metadata"] = {"type": "object"}
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def node_pools(policy: PoolPolicy) -> list[Manifest]:
    objs = build_bundle(policy, stack=StackOptions("karpenter"), vllm_args=explicit_args(policy))
    return [o for o in objs if o["apiVersion"] == "karpenter.sh/v1"]


def cel_problems(obj: Manifest) -> list[str]:
    """The CRD's CEL rules that concern fields gpupool sets."""
    spec = obj["spec"]
    problems = []
    for req in spec["template"]["spec"]["requirements"]:
        key, op, values = req["key"], req["operator"], req.get("values", [])
        if op == "In" and not values:
            problems.append(f"requirement {key}: operator In needs values")
        if op in ("Gt", "Lt") and not (len(values) == 1 and values[0].isdigit()):
            problems.append(f"requirement {key}: {op} needs a single positive integer")
        if op == "In" and "minValues" in req and len(values) < req["minValues"]:
            problems.append(f"requirement {key}: fewer values than minValues")
        domain = key.split("/")[0]
        if key == "kubernetes.io/hostname":
            problems.append("kubernetes.io/hostname is restricted")
        if (
            domain.endswith("kubernetes.io")
            and key not in KUBERNETES_IO_ALLOWED
            and not domain.endswith(("node.kubernetes.io", "node-restriction.kubernetes.io"))
        ):
            problems.append(f"requirement key {key}: domain kubernetes.io is restricted")
        if domain.endswith("k8s.io") and not domain.endswith("kops.k8s.io"):
            problems.append(f"requirement key {key}: domain k8s.io is restricted")
        karpenter_sh = {"karpenter.sh/capacity-type", "karpenter.sh/nodepool"}
        if domain.endswith("karpenter.sh") and key not in karpenter_sh:
            problems.append(f"requirement key {key}: domain karpenter.sh is restricted")
        if domain.endswith("karpenter.k8s.aws") and key not in AWS_REQUIREMENT_KEYS:
            problems.append(f"requirement key {key}: domain karpenter.k8s.aws is restricted")
    for key in spec["template"]["metadata"]["labels"]:
        domain = key.split("/")[0] if "/" in key else ""
        if domain.endswith(RESTRICTED_LABEL_DOMAINS):
            problems.append(f"label {key} is in a restricted domain")
    ref = spec["template"]["spec"]["nodeClassRef"]
    problems += [
        f"nodeClassRef.{k} may not be empty" for k in ("group", "kind", "name") if not ref[k]
    ]
    budgets = spec["disruption"].get("budgets", [])
    problems += [
        "budget schedule without duration"
        for b in budgets
        if ("schedule" in b) != ("duration" in b)
    ]
    return problems


OWN_REQUIREMENTS = [
    {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5e", "p5en"]},
    {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["143359"]},
    {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1e"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"], "min_values": 1},
    {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["4"]},
    {"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "DoesNotExist"},
]
CLOUD_NONE = {
    "cloud": "none",
    "node_class_group": "karpenter.k8s.aws",
    "node_class_kind": "EC2NodeClass",
    "node_class": "gpu",
    "requirements": OWN_REQUIREMENTS,
}
AZURE = {"cloud": "azure", "node_class": "gpu"}

POLICIES = {
    "default": {},
    "instance-types": {
        "node_pools.1.karpenter.instance_types": ["p5e.48xlarge"],
        "node_pools.1.karpenter.consolidation_policy": "WhenEmptyOrUnderutilized",
    },
    "azure": {"node_pools.0.karpenter": AZURE, "node_pools.1.karpenter": AZURE},
    "cloud-none": {"node_pools.1.karpenter": CLOUD_NONE},
    "lifetimes": {
        "node_pools.1.karpenter.expire_after": "Never",
        "node_pools.1.karpenter.termination_grace_period": "1h30m",
    },
    "taints": {
        "node_pools.1.taints": [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
            {"key": "example.com/drain", "value": "soon", "effect": "PreferNoSchedule"},
        ]
    },
}


@pytest.mark.parametrize("case", sorted(POLICIES))
def test_node_pools_match_the_crd_schema(case: str) -> None:
    policy = policy_with(POLICIES[case])
    pools = node_pools(policy)
    assert len(pools) == len(policy.node_pools)
    for obj in pools:
        errors = [e.message for e in VALIDATOR.iter_errors(obj)]
        assert errors == []
        assert cel_problems(obj) == []


def test_cel_check_has_teeth() -> None:
    """The CEL mirror rejects what the API server would: a restricted key, a bad Gt."""
    obj = copy.deepcopy(node_pools(load_policy())[1])
    reqs = obj["spec"]["template"]["spec"]["requirements"]
    reqs.append({"key": "karpenter.k8s.aws/instance-gpu-nam", "operator": "Exists"})
    reqs.append({"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": []})
    assert len(cel_problems(obj)) == 2


# Labels of AWS GPU instance types as karpenter-provider-aws publishes them
# (website/content/en/docs/reference/instance-types.md at commit 0c5e7d81).
AWS_INSTANCE_LABELS = {
    "p5e.48xlarge": {"name": "h200", "count": "8", "memory": "144384"},
    "p5en.48xlarge": {"name": "h200", "count": "8", "memory": "144384"},
    "p5.48xlarge": {"name": "h100", "count": "8", "memory": "81920"},
    "p4d.24xlarge": {"name": "a100", "count": "8", "memory": "40960"},
    "p4de.24xlarge": {"name": "a100", "count": "8", "memory": "81920"},
    "p6-b200.48xlarge": {"name": "b200", "count": "8", "memory": "183359"},
}


def _labels(instance_type: str, capacity_type: str) -> dict[str, str]:
    gpu = AWS_INSTANCE_LABELS[instance_type]
    return {
        "node.kubernetes.io/instance-type": instance_type,
        "karpenter.sh/capacity-type": capacity_type,
        "karpenter.k8s.aws/instance-gpu-name": gpu["name"],
        "karpenter.k8s.aws/instance-gpu-count": gpu["count"],
        "karpenter.k8s.aws/instance-gpu-memory": gpu["memory"],
    }


def _matches(requirement: Manifest, labels: dict[str, str]) -> bool:
    """Kubernetes node-selector semantics of one requirement against a node's labels."""
    value, values = labels.get(requirement["key"]), requirement.get("values", [])
    return {
        "In": lambda: value in values,
        "NotIn": lambda: value not in values,
        "Exists": lambda: value is not None,
        "DoesNotExist": lambda: value is None,
        "Gt": lambda: value is not None and int(value) > int(values[0]),
        "Lt": lambda: value is not None and int(value) < int(values[0]),
    }[requirement["operator"]]()


def admitted(obj: Manifest) -> set[str]:
    """The AWS instance types (any capacity type) a NodePool's requirements admit."""
    reqs = obj["spec"]["template"]["spec"]["requirements"]
    return {
        it
        for it in AWS_INSTANCE_LABELS
        for capacity in ("on-demand", "spot", "reserved")
        if all(_matches(r, _labels(it, capacity)) for r in reqs)
    }


@pytest.mark.parametrize(
    ("gpu_model", "gpu_memory_gib", "expected"),
    [
        ("NVIDIA-H200", 140, {"p5e.48xlarge", "p5en.48xlarge"}),
        ("NVIDIA-H100-80GB-HBM3", 79.6, {"p5.48xlarge"}),
        ("NVIDIA-A100-SXM4-80GB", 79.6, {"p4de.24xlarge"}),
        ("NVIDIA-A100-SXM4-40GB", 39.5, {"p4d.24xlarge", "p4de.24xlarge"}),
        ("NVIDIA-B200", 178, {"p6-b200.48xlarge"}),
    ],
)
def test_aws_requirements_admit_only_gpus_that_hold_the_kv_plan(
    gpu_model: str, gpu_memory_gib: float, expected: set[str]
) -> None:
    """The NodePool admits the instance types of the pool's GPU whose every GPU holds at
    least ``gpu_memory_gib``, so vLLM's KV cache (sized from it) fits the smallest admitted."""
    policy = policy_with(
        {"node_pools.1.gpu_model": gpu_model, "node_pools.1.gpu_memory_gib": gpu_memory_gib}
    )
    flex = node_pools(policy)[1]
    assert admitted(flex) == expected
    smallest = min(int(AWS_INSTANCE_LABELS[it]["memory"]) for it in expected) * 1024**2
    workload = policy.workloads[0]
    model = load_model_spec(DEFAULT_POLICY.parent / workload.hf_config)
    plan = plan_kv_cache(policy, workload, model)
    assert plan.gpu_memory_bytes <= smallest
    assert plan.weight_bytes + plan.activation_reserve_bytes + plan.kv_cache_bytes <= smallest


def test_derived_requirements_per_cloud() -> None:
    aws = node_pools(load_policy())[1]["spec"]["template"]["spec"]
    assert aws["requirements"] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]},
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h200"]},
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["8"]},
        {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["143359"]},
    ]
    assert aws["nodeClassRef"] == {
        "group": "karpenter.k8s.aws",
        "kind": "EC2NodeClass",
        "name": "default",
    }
    azure = node_pools(policy_with(POLICIES["azure"]))[1]["spec"]["template"]["spec"]
    assert azure["requirements"][1:] == [
        {"key": "karpenter.azure.com/sku-gpu-name", "operator": "In", "values": ["H200"]},
        {"key": "karpenter.azure.com/sku-gpu-count", "operator": "In", "values": ["8"]},
    ]
    assert azure["nodeClassRef"] == {
        "group": "karpenter.azure.com",
        "kind": "AKSNodeClass",
        "name": "gpu",
    }
    own = node_pools(policy_with(POLICIES["cloud-none"]))[1]["spec"]["template"]["spec"]
    rendered = [
        {k.replace("minValues", "min_values"): v for k, v in r.items()}
        for r in own["requirements"][1:]
    ]
    assert rendered == OWN_REQUIREMENTS
    (arch,) = [r for r in own["requirements"] if r["key"] == "kubernetes.io/arch"]
    assert arch["minValues"] == 1
    assert own["nodeClassRef"]["name"] == "gpu"


def test_lifetimes_come_from_the_policy() -> None:
    default = node_pools(load_policy())[1]["spec"]["template"]["spec"]
    assert default["expireAfter"] == "720h"
    assert "terminationGracePeriod" not in default
    set_ = node_pools(policy_with(POLICIES["lifetimes"]))[1]["spec"]["template"]["spec"]
    assert (set_["expireAfter"], set_["terminationGracePeriod"]) == ("Never", "1h30m")


def _flex_karpenter(**fields: Any) -> dict[str, Any]:
    return {f"node_pools.1.karpenter.{k}": v for k, v in fields.items()}


def _requirement(**fields: Any) -> dict[str, Any]:
    return _flex_karpenter(requirements=[fields])


NODE_CLASS = {"node_class_group": "example.com", "node_class_kind": "GpuNodeClass"}
A100_80 = {"node_pools.1.gpu_model": "NVIDIA-A100-SXM4-80GB", "node_pools.1.gpu_memory_gib": 79.6}
R0 = "node_pools.1.karpenter.requirements.0"

# case -> (edits, reported path, path whose line is reported, words of the message)
BAD_KARPENTER: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "gcp": (
        _flex_karpenter(cloud="gcp"),
        "node_pools.1.karpenter.cloud",
        "node_pools.1.karpenter.cloud",
        "gcp is not supported: GKE has no Karpenter of its own",
    ),
    "none selects nothing": (
        _flex_karpenter(cloud="none", **NODE_CLASS),
        "node_pools.1.karpenter.requirements",
        "node_pools.1.karpenter",
        "requirements or instance_types must select the pool's GPU instances",
    ),
    "none without node class": (
        _flex_karpenter(cloud="none", instance_types=["p5e.48xlarge"]),
        "node_pools.1.karpenter.node_class_kind",
        "node_pools.1.karpenter",
        "cloud none has no default NodeClass",
    ),
    "node class of another cloud": (
        _flex_karpenter(node_class_group="karpenter.azure.com"),
        "node_pools.1.karpenter.node_class_group",
        "node_pools.1.karpenter.node_class_group",
        "cloud aws provisions with EC2NodeClass in karpenter.k8s.aws",
    ),
    "unknown gpu": (
        {"node_pools.1.gpu_model": "NVIDIA-GeForce-RTX-4090"},
        "node_pools.1.gpu_model",
        "node_pools.1.gpu_model",
        "no aws Karpenter GPU name is known for 'NVIDIA-GeForce-RTX-4090' (family GEFORCE",
    ),
    "derived gpu key": (
        _requirement(key="karpenter.k8s.aws/instance-gpu-name", operator="In", values=["h100"]),
        f"{R0}.key",
        f"{R0}.key",
        "is derived from gpu_model, gpus_per_node and gpu_memory_gib",
    ),
    "derived capacity key": (
        _requirement(key="karpenter.sh/capacity-type", operator="In", values=["spot"]),
        f"{R0}.key",
        f"{R0}.key",
        "karpenter.sh/capacity-type is derived from karpenter.capacity_types",
    ),
    "restricted key": (
        _requirement(key="kubernetes.io/hostname", operator="Exists"),
        f"{R0}.key",
        f"{R0}.key",
        "kubernetes.io/hostname is restricted",
    ),
    "misspelled provider key": (
        _requirement(key="karpenter.k8s.aws/instance-gpu-nam", operator="Exists"),
        f"{R0}.key",
        f"{R0}.key",
        "label domain karpenter.k8s.aws is restricted to the provider's well-known labels",
    ),
    "other provider's key": (
        _requirement(key="karpenter.azure.com/sku-family", operator="In", values=["N"]),
        f"{R0}.key",
        f"{R0}.key",
        "is a label of the azure provider but cloud is aws",
    ),
    "bad operator": (
        _requirement(key="topology.kubernetes.io/zone", operator="Equals", values=["a"]),
        f"{R0}.operator",
        f"{R0}.operator",
        "Input should be 'In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt' or 'Lt'",
    ),
    "In without values": (
        _requirement(key="topology.kubernetes.io/zone", operator="In"),
        f"{R0}.values",
        R0,
        "operator In needs at least one value",
    ),
    "Gt not an integer": (
        _requirement(key="karpenter.k8s.aws/instance-cpu", operator="Gt", values=["lots"]),
        f"{R0}.values",
        f"{R0}.values",
        "operator Gt needs exactly one non-negative integer, found ['lots']",
    ),
    "bad value": (
        _requirement(key="topology.kubernetes.io/zone", operator="In", values=["us east"]),
        f"{R0}.values.0",
        f"{R0}.values.0",
        "expected a label value",
    ),
    "min values": (
        _requirement(
            key="karpenter.k8s.aws/instance-family", operator="In", values=["p5e"], min_values=2
        ),
        f"{R0}.min_values",
        f"{R0}.min_values",
        "min_values 2 needs at least as many values, found 1",
    ),
    "bad instance type": (
        _flex_karpenter(instance_types=["p5e 48xlarge"]),
        "node_pools.1.karpenter.instance_types.0",
        "node_pools.1.karpenter.instance_types.0",
        "expected a label value",
    ),
    "expire pattern": (
        _flex_karpenter(expire_after="30d"),
        "node_pools.1.karpenter.expire_after",
        "node_pools.1.karpenter.expire_after",
        "String should match pattern",
    ),
    "expire zero": (
        _flex_karpenter(expire_after="0h"),
        "node_pools.1.karpenter.expire_after",
        "node_pools.1.karpenter.expire_after",
        "expected a positive duration or Never",
    ),
    "grace period never": (
        _flex_karpenter(termination_grace_period="Never"),
        "node_pools.1.karpenter.termination_grace_period",
        "node_pools.1.karpenter.termination_grace_period",
        "String should match pattern",
    ),
    "azure name covers smaller gpus": (
        {
            **_flex_karpenter(cloud="azure"),
            "node_pools.1.gpu_model": "NVIDIA-H100-NVL",
            "node_pools.1.gpu_memory_gib": 93,
        },
        "node_pools.1.gpu_memory_gib",
        "node_pools.1.gpu_memory_gib",
        "karpenter.azure.com/sku-gpu-name H100 also selects GPUs of 81920 MiB (80 GiB)",
    ),
    "own memory bound below the plan": (
        {
            **A100_80,
            **_flex_karpenter(
                cloud="none",
                **NODE_CLASS,
                requirements=[
                    {
                        "key": "karpenter.k8s.aws/instance-gpu-memory",
                        "operator": "In",
                        "values": ["40960", "81920"],
                    }
                ],
            ),
        },
        R0,
        R0,
        "allow GPUs with 40960 MiB, less than the 81511 MiB (gpu_memory_gib 79.6)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_KARPENTER))
def test_bad_karpenter_settings_are_located_and_nothing_is_rendered(
    tmp_path: Path, case: str
) -> None:
    edits, path, line_path, words = BAD_KARPENTER[case]
    source = write_policy(tmp_path, edited(edits))
    checked = runner.invoke(app, ["validate", str(source)])
    out = tmp_path / "build"
    rendered = runner.invoke(app, ["render", str(source), "--out", str(out), "-t", "karpenter"])
    for result in (checked, rendered):
        assert result.exit_code == 1
        assert "Traceback" not in result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"{source}:{yaml_line(source, line_path)}: {path}: "), line
        assert words in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "template", "spec", "nodeClassRef", "apiVersion"), "v1"),
        (("spec", "disruption", "consolidationPolicy"), "WhenUnderutilized"),
        (("spec", "disruption", "budgets", 0, "nodes"), "ten"),
        (("spec", "template", "spec", "taints", 0, "effect"), "Sometimes"),
        (("spec", "template", "spec", "expireAfter"), "30d"),
        (("spec", "template", "spec", "terminationGracePeriod"), "Never"),
        (("spec", "template", "spec", "requirements", 1, "operator"), "Equals"),
    ],
)
def test_schema_rejects_broken_node_pools(path: tuple[Any, ...], value: Any) -> None:
    """The schema check has teeth: an unknown field, bad enum or bad pattern is rejected."""
    obj = copy.deepcopy(node_pools(load_policy())[1])
    node = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    assert list(VALIDATOR.iter_errors(obj))


def test_schema_file_names_its_source() -> None:
    header = SCHEMA_FILE.read_text().split("type: object")[0]
    assert re.search(r"karpenter.sh_nodepools.yaml", header)
    assert re.search(r"commit [0-9a-f]{40}", header)
