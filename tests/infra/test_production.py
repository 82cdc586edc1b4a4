"""Production workloads: the policy entries, the one patch and its two renderings, the HPA.

The Kustomize component is checked three ways: against a JSON Schema of a ``Component``
written from the kustomize reference (kubectl.docs.kubernetes.io, "patches": a target selects
by group, version, kind, name, namespace, labelSelector, annotationSelector; name and
namespace are anchored regexes; a patch is a file ``path`` or an inline ``patch`` string,
strategic merge or JSON 6902), by parsing its patches, and, where ``kubectl`` is installed,
by building real kustomizations with ``kubectl kustomize`` (kustomize v5 inside) and
comparing the result with the Pulumi path's ``patch_object`` on the same objects.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pulumi
import pytest
import yaml
from typer.testing import CliRunner

from infra.builders.meta import Manifest
from infra.builders.nodepools import node_pools
from infra.builders.production import (
    GPU_TOLERATION,
    GPU_UTILIZATION_METRIC,
    KUSTOMIZE_COMPONENT_API,
    LISTS_DIR,
    PREFER_PROD_WEIGHT,
    autoscaler,
    kustomize_component,
    patch_object,
    patched_pod_spec,
    production_adapter_rules,
    production_autoscalers,
)
from infra.builders.stack_options import TARGETS, StackOptions
from infra.bundle import PRODUCTION, build_bundle, build_groups
from infra.inputs import load_inputs
from infra.production_patch import (
    UnresolvedTarget,
    patch_props,
    production_transform,
    production_transformation,
)
from infra.render import KUSTOMIZATION, PRODUCTION_DIR, production_documents
from policy import DEFAULT_POLICY, PolicyError, PoolPolicy, load_policy, parse_policy
from policy.effects import unlabelled_production
from runtime.cli.app import app
from tests.infra.policies import edited, explicit_args
from tests.infra.test_cli import write_policy
from tests.infra.test_program import Recorder, pulumi_test

VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]

LLAMA: dict[str, Any] = {
    "namespace": "inference",
    "kind": "Deployment",
    "name": "llama-70b-prod",
    "gpus_per_replica": 4,
    "min_replicas": 2,
    "max_replicas": 12,
    "scale_on": "gpu_utilization",
    "target_gpu_utilization": 0.6,
}
"""The shipped example (by name, gpupool's HPA)."""

RANKERS: dict[str, Any] = {
    "namespace": "search",
    "kind": "StatefulSet",
    "selector": {"app": "ranker", "tier": "prod"},
    "gpus_per_replica": 1,
    "max_replicas": 4,
}
"""A selector reference, fixed replicas."""

EMBED: dict[str, Any] = {
    "namespace": "search",
    "name": "embedder",
    "gpus_per_replica": 2,
    "min_replicas": 1,
    "max_replicas": 3,
    "scale_on": "external",
}
"""A name reference whose HPA is the owner's."""


def policy_of(*production: dict[str, Any], edits: dict[str, Any] | None = None) -> PoolPolicy:
    doc = edited(edits)
    doc["production"] = [copy.deepcopy(p) for p in production]
    return parse_policy(doc)


def pod_patch(policy: PoolPolicy) -> Manifest:
    """What a pod template without tolerations or affinity gets."""
    return patched_pod_spec(policy, {})


def problems_of(*production: dict[str, Any], edits: dict[str, Any] | None = None) -> list[Any]:
    with pytest.raises(PolicyError) as caught:
        policy_of(*production, edits=edits)
    return caught.value.problems


# --- policy ---------------------------------------------------------------------------------


def test_shipped_policy_declares_the_example() -> None:
    (llama,) = load_policy().production
    assert (llama.namespace, llama.kind, llama.name, llama.selector) == (
        "inference",
        "Deployment",
        "llama-70b-prod",
        None,
    )
    assert (llama.gpus_per_replica, llama.min_replicas, llama.max_replicas) == (4, 2, 12)
    assert (llama.scale_on, llama.target_gpu_utilization) == ("gpu_utilization", 0.6)
    assert llama.renders_hpa


def test_good_references_validate_and_default() -> None:
    policy = policy_of(LLAMA, RANKERS, EMBED)
    llama, rankers, embed = policy.production
    assert rankers.scale_on == "fixed" and rankers.min_replicas == 1
    assert rankers.label_selector == "app=ranker,tier=prod"
    assert rankers.ref == "search/StatefulSet/{app=ranker,tier=prod}"
    assert embed.kind == "Deployment" and not embed.renders_hpa
    assert (llama.scale_up_stabilization_s, llama.scale_down_stabilization_s) == (0, 600)
    assert policy_of().production == []


def test_a_dumped_policy_loads_back_equal() -> None:
    """The gpupool-policy ConfigMap restates every field (defaults included)."""
    policy = policy_of(LLAMA, RANKERS, EMBED)
    assert PoolPolicy.model_validate(policy.model_dump(by_alias=True, mode="json")) == policy


BAD = [
    ({**LLAMA, "selector": {"app": "x"}}, "production.0.name", ["exactly one", "both"]),
    ({k: v for k, v in RANKERS.items() if k != "selector"}, "production.0.name", ["neither"]),
    ({**RANKERS, "selector": {}}, "production.0.selector", ["empty selector"]),
    ({**RANKERS, "selector": {"bad key!": "x"}}, "production.0.selector", ["'bad key!'"]),
    ({**RANKERS, "selector": {"app": "-x"}}, "production.0.selector", ["'-x'", "label value"]),
    ({**LLAMA, "min_replicas": 13}, "production.0.min_replicas", ["(13)", "(12)"]),
    ({**LLAMA, "max_replicas": 0}, "production.0.max_replicas", ["greater than or equal to 1"]),
    ({**LLAMA, "gpus_per_replica": 0}, "production.0.gpus_per_replica", ["greater than or"]),
    ({**LLAMA, "kind": "Job"}, "production.0.kind", ["Deployment", "StatefulSet"]),
    ({**LLAMA, "scale_on": "cpu"}, "production.0.scale_on", ["gpu_utilization"]),
    ({**LLAMA, "name": "Llama"}, "production.0.name", ["Kubernetes name"]),
    ({**LLAMA, "namespace": "gpupool-flex"}, "production.0.namespace", ["gpupool-flex"]),
    ({**LLAMA, "namespace": "gpupool-system"}, "production.0.namespace", ["own namespace"]),
    ({**LLAMA, "gpus_per_replica": 16}, "production.0.gpus_per_replica", ["16", "have 8"]),
    (
        {k: v for k, v in LLAMA.items() if k != "target_gpu_utilization"},
        "production.0.target_gpu_utilization",
        ["required with scale_on: gpu_utilization"],
    ),
    ({**LLAMA, "target_gpu_utilization": 1.0}, "production.0.target_gpu_utilization", ["1"]),
    (
        {**RANKERS, "scale_on": "gpu_utilization", "target_gpu_utilization": 0.5},
        "production.0.selector",
        ["scaleTargetRef", "use name"],
    ),
    (
        {**EMBED, "target_gpu_utilization": 0.5},
        "production.0.target_gpu_utilization",
        ["only used with scale_on: gpu_utilization", "external"],
    ),
    (
        {**RANKERS, "scale_down_stabilization_s": 60},
        "production.0.scale_down_stabilization_s",
        ["only used with", "fixed"],
    ),
    (
        {**LLAMA, "scale_up_stabilization_s": 900, "scale_down_stabilization_s": 300},
        "production.0.scale_down_stabilization_s",
        ["(300)", "(900)"],
    ),
    (
        {**LLAMA, "min_replicas": 14, "max_replicas": 14},
        "production.0.min_replicas",
        ["56 GPUs", "52 outside its reserve", "reserve_ratio 0.2"],
    ),
    ({**LLAMA, "max_replicas": 25}, "production.0.max_replicas", ["100 GPUs", "hold 96"]),
    ({**LLAMA, "bogus": 1}, "production.0.bogus", ["unknown field"]),
]


@pytest.mark.parametrize(
    ("entry", "path", "words"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_entries_are_rejected_naming_the_field(
    entry: dict[str, Any], path: str, words: list[str]
) -> None:
    problems = problems_of(entry)
    found = [p for p in problems if p.path == path]
    assert found, [str(p) for p in problems]
    for word in words:
        assert word in found[0].message, found[0].message


def test_rules_across_entries() -> None:
    repeated = problems_of(LLAMA, {**LLAMA, "min_replicas": 1})
    assert [p.path for p in repeated] == ["production.1.name"]
    assert "inference/Deployment/llama-70b-prod is repeated" in repeated[0].message
    same_hpa = problems_of(LLAMA, {**LLAMA, "namespace": "staging", "min_replicas": 1})
    assert [p.path for p in same_hpa] == ["production.1.name"]
    assert "llama-70b-prod-hpa" in same_hpa[0].message
    # the same name is fine when gpupool renders only one of the HPAs
    external = {k: v for k, v in LLAMA.items() if k != "target_gpu_utilization"}
    policy_of(LLAMA, external | {"namespace": "staging", "scale_on": "external"})
    # sums are reported once, at the entry that takes them over the limit: 52 GPUs outside
    # gpu-prod's reserve; 48 + 6 crosses at entry 1, entry 2 (60) is not reported again
    floors = problems_of(
        {**LLAMA, "min_replicas": 12},
        {**EMBED, "min_replicas": 3},
        {**EMBED, "name": "other", "min_replicas": 3},
    )
    assert [p.path for p in floors] == ["production.1.min_replicas"]
    assert "reaches 54 GPUs" in floors[0].message


def test_problems_point_at_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text(
        DEFAULT_POLICY.read_text().replace("gpus_per_replica: 4 ", "gpus_per_replica: 9 ")
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(bad)
    (problem,) = [p for p in caught.value.problems if p.path.endswith("gpus_per_replica")]
    assert problem.path == "production.0.gpus_per_replica"
    assert "gpus_per_replica: 9" in bad.read_text().splitlines()[problem.line - 1]


# --- the patch ------------------------------------------------------------------------------


def _pool_taints(policy: PoolPolicy, target: str) -> dict[str, list[Manifest]]:
    """pool name -> taints the nodepools builder puts on its nodes for ``target``."""
    label = policy.cluster.pool_label
    out: dict[str, list[Manifest]] = {}
    for obj in node_pools(policy, target):  # type: ignore[arg-type]
        if obj["kind"] == "Node":
            pool = obj["metadata"]["labels"][label]
            out.setdefault(pool, []).extend(obj.get("spec", {}).get("taints", []))
        else:
            pool = obj["spec"]["template"]["metadata"]["labels"][label]
            out.setdefault(pool, []).extend(obj["spec"]["template"]["spec"].get("taints", []))
    return out


def _tolerated(toleration: Manifest, taint: Manifest) -> bool:
    """Kubernetes' toleration rule (``ToleratesTaint``) for the fields gpupool uses."""
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if toleration.get("key") != taint["key"]:
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("operator") == "Equal" and toleration["value"] == taint["value"])


def _three_pools() -> PoolPolicy:
    """The default plus a second tainted flex pool, ``gpu-spot``."""
    doc = edited({"node_pools.1.nodes": ["flex-a"]})
    spot = copy.deepcopy(doc["node_pools"][1]) | {"name": "gpu-spot", "nodes": ["spot-a"]}
    doc["node_pools"].append(spot)
    doc["production"] = [LLAMA]
    return parse_policy(doc)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("policy", [load_policy(), _three_pools()], ids=["default", "two-flex"])
def test_tolerations_cover_every_pool_taint_as_rendered(policy: PoolPolicy, target: str) -> None:
    taints = _pool_taints(policy, target)
    flex = {p.name for p in policy.flex_pools}
    assert flex <= set(taints) and all(taints[name] for name in flex)
    tolerations = pod_patch(policy)["tolerations"]
    for pool, pool_taints in taints.items():
        for taint in pool_taints:
            assert any(_tolerated(t, taint) for t in tolerations), (pool, taint)
    # one toleration of the pool label's key (every pool's taint) plus the common GPU taint
    assert tolerations == [
        {"key": policy.cluster.pool_label, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    # and nothing else gpupool's label could mean: another key's taint is not tolerated
    assert not any(_tolerated(t, {"key": "dedicated", "effect": "NoSchedule"}) for t in tolerations)


def test_the_flex_pods_tolerations_are_covered_by_productions() -> None:
    """Production may go wherever flex pods go: each flex toleration's taint is tolerated."""
    policy = load_policy()
    objs = build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
    flex = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "llama-8b-flex"
    )
    for toleration in flex["spec"]["template"]["spec"]["tolerations"]:
        taint = {"key": toleration["key"], "value": toleration.get("value", "present")}
        taint["effect"] = toleration["effect"]
        assert any(_tolerated(t, taint) for t in pod_patch(policy)["tolerations"]), toleration


def test_priority_and_affinity() -> None:
    policy = _three_pools()
    patch = pod_patch(policy)
    assert patch["priorityClassName"] == policy.priorities.production.name == "gpupool-production"
    assert set(patch) == {"priorityClassName", "tolerations", "affinity"}
    node = patch["affinity"]["nodeAffinity"]
    label = policy.cluster.pool_label
    (term,) = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (required,) = term["matchExpressions"]
    assert (required["key"], required["operator"]) == (label, "In")
    assert required["values"] == ["gpu-prod", "gpu-flex", "gpu-spot"]
    (preferred,) = node["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == PREFER_PROD_WEIGHT == 100
    assert preferred["preference"]["matchExpressions"] == [
        {"key": label, "operator": "In", "values": ["gpu-prod"]}
    ]


def owner_deployment(
    name: str = "llama-70b-prod",
    namespace: str | None = "inference",
    kind: str = "Deployment",
    labels: dict[str, str] | None = None,
) -> Manifest:
    """An owner's workload with its own toleration, anti-affinity and node selector."""
    meta: Manifest = {"name": name, "labels": labels or {"app": name}}
    if namespace is not None:
        meta["namespace"] = namespace
    obj: Manifest = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": meta,
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 50,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": {"app": name}},
                                    },
                                }
                            ]
                        }
                    },
                    "containers": [{"name": "server", "image": "vllm/vllm-openai:v0.32.0"}],
                },
            },
        },
    }
    if kind == "StatefulSet":
        obj["spec"]["serviceName"] = name
    return obj


def test_patch_object_keeps_the_owners_fields() -> None:
    policy = policy_of(LLAMA)
    obj = owner_deployment()
    out = patch_object(policy, obj)
    assert out is not None and obj == owner_deployment()  # the input is not modified
    pod = out["spec"]["template"]["spec"]
    patch = pod_patch(policy)
    assert pod["priorityClassName"] == patch["priorityClassName"]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}, *patch["tolerations"]]
    assert pod["affinity"]["nodeAffinity"] == patch["affinity"]["nodeAffinity"]
    assert (
        pod["affinity"]["podAntiAffinity"]
        == obj["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    )
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert out["spec"]["replicas"] == 2 and out["metadata"] == obj["metadata"]
    # patched again, only the GPU toleration repeats (a JSON 6902 append, in Kustomize too)
    again = patch_object(policy, out)
    assert again is not None
    assert again["spec"]["template"]["spec"].pop("tolerations") == [
        *pod["tolerations"],
        GPU_TOLERATION,
    ]
    assert {**again["spec"]["template"]["spec"], "tolerations": pod["tolerations"]} == pod
    for kubernetes in VERSIONS:
        kubernetes_validate.validate(out, kubernetes, strict=True)


def test_patch_object_targets_only_the_references() -> None:
    policy = policy_of(LLAMA, RANKERS)
    assert patch_object(policy, owner_deployment()) is not None
    assert patch_object(policy, owner_deployment(name="llama-70b-canary")) is None
    assert patch_object(policy, owner_deployment(namespace="staging")) is None
    assert patch_object(policy, owner_deployment(kind="StatefulSet")) is None
    assert patch_object(policy, owner_deployment(namespace=None)) is None
    assert patch_object(policy, owner_deployment(namespace=None), default_namespace="inference")
    ranker = owner_deployment(
        "ranker-0", "search", "StatefulSet", {"app": "ranker", "tier": "prod"}
    )
    assert patch_object(policy, ranker) is not None
    ranker["metadata"]["labels"]["tier"] = "canary"
    assert patch_object(policy, ranker) is None
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama-70b-prod"}}
    assert (
        patch_object(
            policy, service | {"metadata": {"name": "llama-70b-prod", "namespace": "inference"}}
        )
        is None
    )


# --- the Kustomize component ------------------------------------------------------------------

_STRING = {"type": "string", "minLength": 1}
_SELECT_KEYS = ("group", "version", "kind", "name", "namespace", "labelSelector")
_TARGET: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {key: _STRING for key in (*_SELECT_KEYS, "annotationSelector")},
}
COMPONENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind"],
    "properties": {
        "apiVersion": {"const": KUSTOMIZE_COMPONENT_API},
        "kind": {"const": "Component"},
        "components": {"type": "array", "items": _STRING},
        "resources": {"type": "array", "items": _STRING},
        "patches": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["target"],
                "oneOf": [{"required": ["patch"]}, {"required": ["path"]}],
                "properties": {"patch": _STRING, "path": _STRING, "target": _TARGET},
            },
        },
        "replacements": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["source", "targets"],
                "properties": {
                    "source": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["kind", "name", "fieldPath"],
                        "properties": {k: _STRING for k in ("kind", "name", "fieldPath")},
                    },
                    "targets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["select", "fieldPaths"],
                            "properties": {
                                "select": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {k: _STRING for k in _SELECT_KEYS},
                                },
                                "fieldPaths": {"type": "array", "minItems": 1, "items": _STRING},
                                "options": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"create": {"type": "boolean"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
"""A Kustomize ``Component`` with the fields gpupool renders (kubectl.docs.kubernetes.io:
"patches", "replacements", "components"), closed."""


def _component_files(policy: PoolPolicy) -> dict[str, Manifest]:
    prefix = f"{PRODUCTION_DIR}/"
    out: dict[str, Manifest] = {}
    for name, text in production_documents(policy).items():
        assert name.startswith(prefix)
        out[name.removeprefix(prefix)] = yaml.safe_load(text)
    return out


def test_component_schema_rejects_a_typo() -> None:
    """The schema has teeth: a misspelled target or select field fails it."""
    files = kustomize_component(policy_of(LLAMA))
    for name in (KUSTOMIZATION, f"{LISTS_DIR}/{KUSTOMIZATION}"):
        jsonschema.validate(files[name], COMPONENT_SCHEMA)
    broken = copy.deepcopy(files[KUSTOMIZATION])
    broken["patches"][0]["target"]["labelselector"] = "a=b"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, COMPONENT_SCHEMA)
    broken = copy.deepcopy(files[f"{LISTS_DIR}/{KUSTOMIZATION}"])
    broken["replacements"][0]["targets"][0]["select"]["labelselector"] = "a=b"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, COMPONENT_SCHEMA)


def test_component_files_and_targets() -> None:
    policy = policy_of(LLAMA, RANKERS)
    files = _component_files(policy)
    assert files == kustomize_component(policy)
    assert set(files) == {KUSTOMIZATION, f"{LISTS_DIR}/{KUSTOMIZATION}", f"{LISTS_DIR}/values.yaml"}
    top, lists = files[KUSTOMIZATION], files[f"{LISTS_DIR}/{KUSTOMIZATION}"]
    assert top["components"] == [LISTS_DIR] and lists["resources"] == ["values.yaml"]
    llama = {"group": "apps", "version": "v1", "kind": "Deployment", "name": "llama-70b-prod"}
    rankers = {
        "group": "apps",
        "version": "v1",
        "kind": "StatefulSet",
        "labelSelector": "app=ranker,tier=prod",
    }
    assert [p["target"] for p in top["patches"]] == [
        llama | {"namespace": "inference|default"},
        llama | {"namespace": "inference|default"},
        rankers | {"namespace": "search|default"},
        rankers | {"namespace": "search|default"},
    ]
    for replacement in lists["replacements"]:
        assert [t["select"] for t in replacement["targets"]] == [
            llama | {"namespace": "inference"},
            llama | {"namespace": "default"},
            rankers | {"namespace": "search"},
            rankers | {"namespace": "default"},
        ]
    values = files[f"{LISTS_DIR}/values.yaml"]
    assert values["metadata"]["annotations"] == {"config.kubernetes.io/local-config": "true"}
    assert kustomize_component(policy_of()) == {} and production_documents(policy_of()) == {}


def test_render_writes_the_component_beside_the_objects(tmp_path: Path) -> None:
    out = tmp_path / "build"
    result = CliRunner().invoke(app, ["render", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name, doc in kustomize_component(load_policy()).items():
        assert yaml.safe_load((out / PRODUCTION_DIR / name).read_text()) == doc
    top = yaml.safe_load((out / KUSTOMIZATION).read_text())
    assert not any(r.startswith(PRODUCTION_DIR) for r in top["resources"])
    assert "inference/horizontalpodautoscaler-llama-70b-prod.yaml" in top["resources"]


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl (with its built-in kustomize) is not installed"
)


def _kustomize(folder: Path) -> list[Manifest]:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, check=False, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return list(yaml.safe_load_all(built.stdout))


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(data) if isinstance(data, list) else yaml.safe_dump(data))


def _build(tmp_path: Path, policy: PoolPolicy, objects: list[Manifest], **top: Any) -> Any:
    """``kubectl kustomize`` of ``objects`` with the rendered Component, by (kind, name)."""
    _write(tmp_path / "base/objects.yaml", objects)
    _write(tmp_path / "base" / KUSTOMIZATION, {"resources": ["objects.yaml"]})
    for name, text in production_documents(policy).items():
        (tmp_path / "gpupool" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "gpupool" / name).write_text(text)
    overlay = {"resources": ["../base"], "components": [f"../gpupool/{PRODUCTION_DIR}"], **top}
    _write(tmp_path / "overlay" / KUSTOMIZATION, overlay)
    return {(o["kind"], o["metadata"]["name"]): o for o in _kustomize(tmp_path / "overlay")}


@pytest.mark.process
@needs_kubectl
@pytest.mark.parametrize("layout", ["namespaced-base", "overlay-sets-namespace"])
def test_kustomize_build_equals_the_pulumi_path(tmp_path: Path, layout: str) -> None:
    """Real ``kubectl kustomize``: targeted objects get exactly ``patch_object``'s result,
    the others nothing, and the values object never reaches the output."""
    policy = policy_of(LLAMA, {**RANKERS, "namespace": "inference"})
    with_ns = layout == "namespaced-base"
    ns = "inference" if with_ns else None
    objects = [
        owner_deployment(namespace=ns),
        owner_deployment("ranker", ns, "StatefulSet", {"app": "ranker", "tier": "prod"}),
        owner_deployment("llama-70b-canary", ns),  # not referenced
        owner_deployment("ranker-canary", ns, "StatefulSet", {"app": "ranker", "tier": "canary"}),
    ]
    built = _build(tmp_path, policy, objects, **({} if with_ns else {"namespace": "inference"}))
    assert len(built) == len(objects)  # ProductionPatchValues is local-config: left out
    for obj in objects:
        placed = copy.deepcopy(obj)
        placed["metadata"]["namespace"] = "inference"
        expected = patch_object(policy, placed) or placed
        assert built[(obj["kind"], obj["metadata"]["name"])] == expected, obj["metadata"]["name"]
    assert built[("Deployment", "llama-70b-canary")] == {
        **objects[2],
        "metadata": {**objects[2]["metadata"], "namespace": "inference"},
    }


L = "gpupool.io/pool"
POOLS = {"key": L, "operator": "In", "values": ["gpu-prod", "gpu-flex"]}
PROD = {"key": L, "operator": "In", "values": ["gpu-prod"]}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
HOST = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
OWN = {"key": "dedicated", "operator": "Exists"}
POOL_T = {"key": L, "operator": "Exists", "effect": "NoSchedule"}
GPU_T = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ANTI = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}
        ]
    }
}


def _required(*terms: Manifest) -> Manifest:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}


def _preferred(*terms: tuple[int, list[Manifest]]) -> Manifest:
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": w, "preference": {"matchExpressions": e}} for w, e in terms
        ]
    }


OURS = _required({"matchExpressions": [POOLS]}) | _preferred((100, [PROD]))
SHAPES: dict[str, tuple[Manifest, list[Manifest], Manifest]] = {
    # name: (pod spec fields before, tolerations after, affinity after)
    "bare": ({}, [POOL_T, GPU_T], {"nodeAffinity": OURS}),
    "empty-tolerations": ({"tolerations": []}, [POOL_T, GPU_T], {"nodeAffinity": OURS}),
    "own-toleration": ({"tolerations": [OWN]}, [OWN, POOL_T, GPU_T], {"nodeAffinity": OURS}),
    "own-pool-toleration": (
        # a hand-written toleration of one pool gives way to gpupool's of every pool
        {"tolerations": [{"key": L, "operator": "Equal", "value": "gpu-prod"}, OWN]},
        [POOL_T, OWN, GPU_T],
        {"nodeAffinity": OURS},
    ),
    "own-gpu-toleration": (
        {"tolerations": [GPU_T]},
        [GPU_T, POOL_T, GPU_T],  # appended again: harmless, as Kustomize can only append
        {"nodeAffinity": OURS},
    ),
    "pod-anti-affinity": ({"affinity": ANTI}, [POOL_T, GPU_T], ANTI | {"nodeAffinity": OURS}),
    "required-terms": (
        {
            "tolerations": [OWN],
            "affinity": {
                "nodeAffinity": _required({"matchExpressions": [ZONE]}, {"matchFields": [HOST]})
            },
        },
        [OWN, POOL_T, GPU_T],
        {
            "nodeAffinity": _required(
                {"matchExpressions": [ZONE, POOLS]},
                {"matchFields": [HOST], "matchExpressions": [POOLS]},
            )
            | _preferred((100, [PROD]))
        },
    ),
    "own-pool-expression": (
        {"affinity": {"nodeAffinity": _required({"matchExpressions": [PROD, ZONE]})}},
        [POOL_T, GPU_T],
        {
            "nodeAffinity": _required({"matchExpressions": [POOLS, ZONE]})
            | _preferred((100, [PROD]))
        },
    ),
    "preferred-only": (
        {"affinity": {"nodeAffinity": _preferred((50, [ZONE]))} | ANTI},
        [POOL_T, GPU_T],
        {
            "nodeAffinity": _required({"matchExpressions": [POOLS]})
            | _preferred((50, [ZONE]), (100, [PROD]))
        }
        | ANTI,
    ),
    "preferred-weight-100": (
        {"affinity": {"nodeAffinity": _preferred((100, [ZONE]), (10, [ZONE]))}},
        [POOL_T, GPU_T],
        {
            "nodeAffinity": _required({"matchExpressions": [POOLS]})
            | _preferred((100, [ZONE, PROD]), (10, [ZONE]))
        },
    ),
}
"""Pod templates an owner may have, and what production pods built from them must get."""


def _shaped(kind: str, name: str, fields: Manifest) -> Manifest:
    obj = owner_deployment(name, "inference", kind)
    pod = obj["spec"]["template"]["spec"]
    for key in ("tolerations", "affinity"):
        del pod[key]
    pod.update(copy.deepcopy(fields))
    return obj


@pytest.mark.process
@needs_kubectl
@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
def test_kustomize_merges_into_every_workload_shape(tmp_path: Path, kind: str) -> None:
    """Every shape, built by ``kubectl kustomize``: exactly the expected tolerations and
    affinity (the owner's kept), the same as ``patch_object``, valid Kubernetes."""
    policy = policy_of(
        {
            **LLAMA,
            "kind": kind,
            "name": None,
            "selector": {"tier": "prod"},
            "scale_on": "fixed",
            "target_gpu_utilization": None,
        }
    )
    objects = [_shaped(kind, name, fields) for name, (fields, _, _) in SHAPES.items()]
    for obj in objects:
        obj["metadata"]["labels"]["tier"] = "prod"
    built = _build(tmp_path, policy, objects)
    assert len(built) == len(SHAPES)
    for obj, (name, (_, tolerations, affinity)) in zip(objects, SHAPES.items(), strict=True):
        pod = built[(kind, name)]["spec"]["template"]["spec"]
        assert pod["tolerations"] == tolerations, name
        assert pod["affinity"] == affinity, name
        assert pod["priorityClassName"] == "gpupool-production", name
        assert built[(kind, name)] == patch_object(policy, obj), name
        for kubernetes in VERSIONS:
            kubernetes_validate.validate(built[(kind, name)], kubernetes, strict=True)


# --- the order: label the nodes, then apply the Component ---------------------------------


def _unlabelled(tmp_path: Path, **edits: Any) -> Path:
    return write_policy(tmp_path, edited({"node_pools.0.nodes": [], **edits}))


def test_labels_target_refuses_production_before_its_nodes(tmp_path: Path) -> None:
    """No gpu-prod node listed: the production Component would require a label no node
    carries. One located line with the steps in order; nothing written."""
    source, out = _unlabelled(tmp_path), tmp_path / "build"
    result = CliRunner().invoke(app, ["render", str(source), "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"{source}:") and ": node_pools.0.nodes: " in line
    assert source.read_text().splitlines()[int(line.split(":")[1]) - 1] == "  nodes: []"
    steps = ["list the gpu-prod nodes here first", "apply the rendered bundle", "only then add"]
    at = [line.index(step) for step in steps]
    assert at == sorted(at), line
    assert "inference/Deployment/llama-70b-prod" in line and "gpupool.io/pool" in line
    assert not out.exists()


def test_the_refusal_is_for_the_labels_target_with_production_only(tmp_path: Path) -> None:
    source = _unlabelled(tmp_path)
    karpenter = ["render", str(source), "--out", str(tmp_path / "k"), "--target", "karpenter"]
    assert CliRunner().invoke(app, karpenter).exit_code == 0
    (tmp_path / "none").mkdir()
    bare = write_policy(tmp_path / "none", edited({"node_pools.0.nodes": [], "production": []}))
    result = CliRunner().invoke(app, ["render", str(bare), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert load_inputs(source).policy.production  # validate (no target) still accepts it
    with pytest.raises(PolicyError) as caught:
        load_inputs(source, target="labels")
    assert [p.path for p in caught.value.problems] == ["node_pools.0.nodes"]
    assert unlabelled_production(policy_of(LLAMA)) is None  # the default lists its nodes


# --- the HPA and the adapter rule -----------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
def test_hpa_is_valid_kubernetes(version: str, kind: str) -> None:
    policy = policy_of({**LLAMA, "kind": kind})
    (hpa,) = production_autoscalers(policy)
    kubernetes_validate.validate(hpa, version, strict=True)
    broken = copy.deepcopy(hpa)
    broken["spec"]["metrics"][0]["pods"]["targetValue"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_hpa_fields() -> None:
    policy = policy_of(
        {**LLAMA, "target_gpu_utilization": 0.55, "scale_down_stabilization_s": 900}, RANKERS, EMBED
    )
    (hpa,) = production_autoscalers(policy)
    assert hpa == autoscaler(policy, policy.production[0])
    meta, spec = hpa["metadata"], hpa["spec"]
    assert (meta["name"], meta["namespace"]) == ("llama-70b-prod", "inference")
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "llama-70b-prod",
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 12)
    (metric,) = spec["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": GPU_UTILIZATION_METRIC},
            "target": {"type": "AverageValue", "averageValue": "550m"},
        },
    }
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0
    assert {(p["type"], p["value"]) for p in up["policies"]} == {("Percent", 100), ("Pods", 4)}
    assert down["stabilizationWindowSeconds"] == 900
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]


def test_adapter_rule_serves_the_hpa_metric() -> None:
    policy = policy_of(
        LLAMA,
        {
            **EMBED,
            "namespace": "chat",
            "name": "mixtral",
            "scale_on": "gpu_utilization",
            "target_gpu_utilization": 0.5,
        },
        RANKERS,
    )
    (rule,) = production_adapter_rules(policy)["rules"]
    assert rule["name"]["as"] == GPU_UTILIZATION_METRIC
    assert rule["seriesQuery"] == 'DCGM_FI_DEV_GPU_UTIL{namespace=~"chat|inference",pod!=""}'
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert "/ 100" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    assert production_adapter_rules(policy_of(RANKERS, EMBED)) == {"rules": []}
    # Scraped without honorLabels, dcgm-exporter's pod labels arrive as exported_*: the rule
    # follows metrics.gpu_pod_labels, the same labels the catalogue joins on.
    exported = policy_of(
        LLAMA, edits={"metrics.gpu_pod_labels": ["exported_namespace", "exported_pod"]}
    )
    (rule,) = production_adapter_rules(exported)["rules"]
    assert rule["seriesQuery"] == (
        'DCGM_FI_DEV_GPU_UTIL{exported_namespace=~"inference",exported_pod!=""}'
    )
    assert rule["resources"]["overrides"] == {
        "exported_namespace": {"resource": "namespace"},
        "exported_pod": {"resource": "pod"},
    }


def test_bundle_groups_the_hpas_only_when_there_are_some() -> None:
    def production_groups(policy: PoolPolicy) -> list[Any]:
        groups = build_groups(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
        return [g for g in groups if g.component == PRODUCTION]

    (group,) = production_groups(policy_of(LLAMA, RANKERS, EMBED))
    assert group.name == "production"
    assert [o["metadata"]["name"] for o in group.objects] == ["llama-70b-prod"]
    assert production_groups(policy_of(RANKERS, EMBED)) == []
    assert production_groups(policy_of()) == []


# --- the Pulumi transformation -----------------------------------------------------------------


RECORDER = Recorder()


@pytest.fixture
def recorder() -> Recorder:
    RECORDER.registered.clear()
    pulumi.runtime.set_mocks(RECORDER, preview=False)
    return RECORDER


class Args:
    """What both transformation APIs pass (``ResourceTransformationArgs``-shaped)."""

    def __init__(self, type_: str, name: str, props: dict[str, Any]) -> None:
        self.type_, self.name, self.props = type_, name, props
        self.opts = pulumi.ResourceOptions()


def _props(obj: Manifest) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


def test_transformation_yields_the_same_patch() -> None:
    policy = policy_of(LLAMA, RANKERS)
    obj = owner_deployment()
    transformation = production_transformation(policy)
    result = transformation(Args("kubernetes:apps/v1:Deployment", "llama", _props(obj)))  # type: ignore[arg-type]
    assert isinstance(result, pulumi.ResourceTransformationResult)
    expected = patch_object(policy, obj)
    assert expected is not None
    assert result.props == _props(expected)
    # the new ``transforms`` API, on wire-form (camelCase) properties
    transform = production_transform(policy)
    wire = {"apiVersion": "apps/v1", "kind": "Deployment", **_props(obj)}
    out = transform(Args("kubernetes:apps/v1:Deployment", "llama", wire))  # type: ignore[arg-type]
    assert isinstance(out, pulumi.ResourceTransformResult)
    assert out.props == {"apiVersion": "apps/v1", "kind": "Deployment", **_props(expected)}


def test_transformation_leaves_other_resources_alone() -> None:
    policy = policy_of(LLAMA, RANKERS)
    transformation = production_transformation(policy)
    others = [
        ("kubernetes:apps/v1:Deployment", owner_deployment("llama-70b-canary")),
        ("kubernetes:apps/v1:Deployment", owner_deployment(namespace="staging")),
        ("kubernetes:apps/v1:StatefulSet", owner_deployment(kind="StatefulSet")),
        ("kubernetes:core/v1:Service", owner_deployment()),  # same metadata, another kind
        ("kubernetes:autoscaling/v2:HorizontalPodAutoscaler", owner_deployment()),
        ("gpupool:flex:InferenceWorkload", {}),
    ]
    for type_, obj in others:
        assert transformation(Args(type_, "x", _props(obj))) is None, type_  # type: ignore[arg-type]
    ranker = owner_deployment(
        "ranker-0", "search", "StatefulSet", {"app": "ranker", "tier": "prod"}
    )
    hit = patch_props(policy, "kubernetes:apps/v1:StatefulSet", "r", _props(ranker))
    assert hit is not None and hit["spec"]["template"]["spec"]["priorityClassName"]


def test_transformation_refuses_unresolved_metadata(recorder: Recorder) -> None:
    policy = policy_of(LLAMA)
    props = _props(owner_deployment())
    props["metadata"] = {**props["metadata"], "namespace": pulumi.Output.from_input("inference")}
    with pytest.raises(UnresolvedTarget, match="namespace"):
        patch_props(policy, "kubernetes:apps/v1:Deployment", "llama", props)


@pulumi_test
def test_transformation_on_typed_resources_under_mocks(recorder: Recorder) -> pulumi.Output[None]:
    """A real pulumi_kubernetes Deployment built from input types, an Output in its pod
    spec, and an untargeted one: what Pulumi registers."""
    from pulumi_kubernetes.apps.v1 import Deployment, DeploymentSpecArgs
    from pulumi_kubernetes.core.v1 import (
        ContainerArgs,
        PodSpecArgs,
        PodTemplateSpecArgs,
        TolerationArgs,
    )
    from pulumi_kubernetes.meta.v1 import LabelSelectorArgs, ObjectMetaArgs

    policy = policy_of(LLAMA)
    opts = pulumi.ResourceOptions(transformations=[production_transformation(policy)])

    def deployment(name: str) -> Deployment:
        toleration = TolerationArgs(key="dedicated", operator="Exists")
        return Deployment(
            name,
            metadata=ObjectMetaArgs(name=name, namespace="inference"),
            spec=DeploymentSpecArgs(
                selector=LabelSelectorArgs(match_labels={"app": name}),
                template=PodTemplateSpecArgs(
                    metadata=ObjectMetaArgs(labels={"app": name}),
                    spec=PodSpecArgs(
                        containers=[ContainerArgs(name="server", image="x")],
                        termination_grace_period_seconds=30,
                        tolerations=pulumi.Output.from_input([toleration]),
                    ),
                ),
            ),
            opts=opts,
        )

    targeted, other = deployment("llama-70b-prod"), deployment("llama-70b-canary")
    patch = pod_patch(policy)

    def check(_: Any) -> None:
        registered = {n: i for t, n, i in recorder.registered if t.endswith(":Deployment")}
        pod = registered["llama-70b-prod"]["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == patch["priorityClassName"]
        assert pod["tolerations"] == [
            {"key": "dedicated", "operator": "Exists"},
            *patch["tolerations"],
        ]
        assert pod["affinity"] == patch["affinity"]
        assert pod["terminationGracePeriodSeconds"] == 30
        untouched = registered["llama-70b-canary"]["spec"]["template"]["spec"]
        assert "priorityClassName" not in untouched and "affinity" not in untouched
        assert untouched["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]

    return pulumi.Output.all(targeted.urn, other.urn).apply(check)
