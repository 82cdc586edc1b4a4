"""Karpenter NodePools against the NodePool CRD's openAPIV3Schema (stored with its source).

The API server prunes or, with strict field validation, rejects unknown fields; jsonschema
does neither, so every object schema without ``additionalProperties`` is closed here.
The CRD's CEL rules that apply to what gpupool renders are checked explicitly.
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
from infra.bundle import build_bundle
from policy import PoolPolicy, load_policy
from tests.infra.policies import explicit_args, policy_with

SCHEMA_FILE = Path(__file__).parent / "data" / "karpenter_nodepool_v1.schema.yaml"
RESTRICTED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh")


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
    objs = build_bundle(policy, target="karpenter", vllm_args=explicit_args(policy))
    return [o for o in objs if o["apiVersion"] == "karpenter.sh/v1"]


def cel_problems(obj: Manifest) -> list[str]:
    """The CRD's CEL rules that concern fields gpupool sets."""
    spec = obj["spec"]
    problems = []
    for req in spec["template"]["spec"]["requirements"]:
        if req["operator"] == "In" and not req.get("values"):
            problems.append(f"requirement {req['key']}: operator In needs values")
        domain = req["key"].split("/")[0] if "/" in req["key"] else ""
        allowed = {"karpenter.sh/capacity-type", "node.kubernetes.io/instance-type"}
        if domain.endswith(RESTRICTED_LABEL_DOMAINS) and req["key"] not in allowed:
            problems.append(f"requirement key {req['key']} is in a restricted domain")
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


@pytest.mark.parametrize(
    "policy",
    [
        load_policy(),
        policy_with(
            {
                "node_pools.1.karpenter.instance_types": ["p5e.48xlarge"],
                "node_pools.1.karpenter.consolidation_policy": "WhenEmptyOrUnderutilized",
            }
        ),
    ],
    ids=["default", "instance-types"],
)
def test_node_pools_match_the_crd_schema(policy: PoolPolicy) -> None:
    pools = node_pools(policy)
    assert len(pools) == len(policy.node_pools)
    for obj in pools:
        errors = [e.message for e in VALIDATOR.iter_errors(obj)]
        assert errors == []
        assert cel_problems(obj) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "template", "spec", "nodeClassRef", "apiVersion"), "v1"),
        (("spec", "disruption", "consolidationPolicy"), "WhenUnderutilized"),
        (("spec", "disruption", "budgets", 0, "nodes"), "ten"),
        (("spec", "template", "spec", "taints", 0, "effect"), "Sometimes"),
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
