"""Lending as rendered: where flex pods may run, which taints they tolerate, how they pack
and spread, and the HPA bound, on both node-pool targets, lending on and off.

Every rendered Deployment and HPA here also passes kubernetes-validate in strict mode. The
Karpenter check evaluates the pod's required node affinity against each rendered NodePool
the way Karpenter's scheduler does (``Requirements.Compatible``, sigs.k8s.io/karpenter
pkg/scheduling: a label key that is not well known must be defined by the NodePool), so a
pending flex pod can make Karpenter launch a node of its flex pool and never one of a pool
that lends (docs/design/lending.md, "Karpenter").
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from infra.builders.meta import Manifest
from infra.builders.stack_options import TARGETS, StackOptions
from infra.builders.workload import KARPENTER_INITIALIZED
from infra.bundle import build_bundle
from policy import PoolPolicy
from tests.infra.policies import explicit_args, policy_with, two_workloads

VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
LABEL = "gpupool.io/pool"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

KARPENTER_WELL_KNOWN = {
    "karpenter.sh/nodepool",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "karpenter.sh/capacity-type",
    "node.kubernetes.io/windows-build",
}
"""Karpenter's ``WellKnownLabels`` (pkg/apis/v1/labels.go): a pod may require these although
a NodePool leaves them undefined; any other key the NodePool must define."""


def _objects(policy: PoolPolicy, target: str) -> list[Manifest]:
    return build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]


def _one(objs: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _pod(objs: list[Manifest], name: str = "llama-8b-flex") -> Manifest:
    spec: Manifest = _one(objs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def _terms(pod: Manifest) -> list[Manifest]:
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms: list[Manifest] = required["nodeSelectorTerms"]
    return terms


def _pool_toleration(pool: str) -> Manifest:
    return {"key": LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}


LENDING = {"on": {}, "off": {"node_pools.0.lend_idle": False}}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lending", sorted(LENDING))
def test_flex_objects_are_valid_kubernetes(lending: str, target: str, version: str) -> None:
    """The Deployment (node affinity, pod affinity and anti-affinity, tolerations) and the
    HPA pass strict validation with lending on and off."""
    objs = _objects(policy_with(LENDING[lending]), target)
    for kind in ("Deployment", "HorizontalPodAutoscaler"):
        kubernetes_validate.validate(_one(objs, kind, "llama-8b-flex"), version, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_without_lending_flex_is_confined_to_its_flex_pool(target: str) -> None:
    objs = _objects(policy_with(LENDING["off"]), target)
    pod = _pod(objs)
    assert pod["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": LABEL, "operator": "In", "values": ["gpu-flex"]}]}
            ]
        }
    }
    assert pod["tolerations"] == [_pool_toleration("gpu-flex"), GPU_TOLERATION]
    assert "nodeSelector" not in pod
    hpa = _one(objs, "HorizontalPodAutoscaler", "llama-8b-flex")["spec"]
    assert hpa["maxReplicas"] == 4 * 8  # auto: gpu-flex alone


@pytest.mark.parametrize("target", TARGETS)
def test_lending_admits_the_prod_pool_and_prefers_the_flex_pool(target: str) -> None:
    objs = _objects(policy_with(), target)
    pod = _pod(objs)
    terms = _terms(pod)
    if target == "labels":
        assert terms == [
            {
                "matchExpressions": [
                    {"key": LABEL, "operator": "In", "values": ["gpu-flex", "gpu-prod"]}
                ]
            }
        ]
    else:
        assert terms == [
            {"matchExpressions": [{"key": LABEL, "operator": "In", "values": ["gpu-flex"]}]},
            {
                "matchExpressions": [
                    {"key": LABEL, "operator": "In", "values": ["gpu-prod"]},
                    {"key": KARPENTER_INITIALIZED, "operator": "In", "values": ["true"]},
                ]
            },
        ]
    (preferred,) = pod["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred == {
        "weight": 100,
        "preference": {
            "matchExpressions": [{"key": LABEL, "operator": "In", "values": ["gpu-flex"]}]
        },
    }
    assert pod["tolerations"] == [
        _pool_toleration("gpu-flex"),
        _pool_toleration("gpu-prod"),
        GPU_TOLERATION,
    ]
    hpa = _one(objs, "HorizontalPodAutoscaler", "llama-8b-flex")["spec"]
    assert hpa["maxReplicas"] == 4 * 8 + 8 * 8  # auto: gpu-flex and gpu-prod


def test_an_untainted_lending_pool_needs_no_toleration() -> None:
    pod = _pod(_objects(policy_with({"node_pools.0.taint": False}), "labels"))
    assert "gpu-prod" in _terms(pod)[0]["matchExpressions"][0]["values"]
    assert pod["tolerations"] == [_pool_toleration("gpu-flex"), GPU_TOLERATION]


@pytest.mark.parametrize("lend", [True, False])
def test_an_explicit_max_replicas_is_the_hpa_bound(lend: bool) -> None:
    policy = policy_with({"node_pools.0.lend_idle": lend, "workloads.0.max_replicas": 10})
    hpa = _one(_objects(policy, "labels"), "HorizontalPodAutoscaler", "llama-8b-flex")["spec"]
    assert hpa["maxReplicas"] == 10


def _matches(selector: Manifest, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("target", TARGETS)
def test_flex_packs_onto_nodes_running_any_flex_pod(target: str) -> None:
    """The pod affinity selects the pods of every flex workload, in the flex namespace (the
    term names no namespace: the pod's own), and no other pod gpupool renders."""
    policy = two_workloads()
    objs = _objects(policy, target)
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    flex = [d for d in deployments if d["metadata"]["name"] in {"llama-8b-flex", "qwen-14b-flex"}]
    assert len(flex) == 2
    assert {d["metadata"]["namespace"] for d in flex} == {policy.cluster.flex_namespace}
    for deployment in flex:
        affinity = deployment["spec"]["template"]["spec"]["affinity"]
        (pack,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        term = pack["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert "namespaces" not in term and "namespaceSelector" not in term
        for other in deployments:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert _matches(term["labelSelector"], labels) == (other in flex), other["metadata"]
        # spread: the workload's own replicas only, over zones, weaker than packing
        (spread,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert spread["podAffinityTerm"]["topologyKey"] == "topology.kubernetes.io/zone"
        assert spread["weight"] < pack["weight"]
        for other in flex:
            labels = other["spec"]["template"]["metadata"]["labels"]
            own = other is deployment
            assert _matches(spread["podAffinityTerm"]["labelSelector"], labels) == own


def test_required_anti_affinity_adds_one_replica_per_node() -> None:
    """``anti_affinity: required`` (two_workloads) keeps the zone spread and the packing, and
    refuses a second replica of the workload on a node."""
    pod = _pod(_objects(two_workloads(), "labels"), "qwen-14b-flex")
    anti = pod["affinity"]["podAntiAffinity"]
    (node,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node["topologyKey"] == "kubernetes.io/hostname"
    assert node["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "qwen-14b-flex"
    assert len(anti["preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    assert "podAffinity" in pod["affinity"]


def _requirements(node_pool: Manifest) -> dict[str, tuple[str, set[str]]]:
    """A NodePool's template as Karpenter's scheduler sees it: its requirements, its labels
    and ``karpenter.sh/nodepool`` (``NewNodeClaimTemplate``)."""
    template = node_pool["spec"]["template"]
    out = {
        r["key"]: (r["operator"], set(r.get("values", [])))
        for r in template["spec"]["requirements"]
    }
    labels = {
        **template["metadata"]["labels"],
        "karpenter.sh/nodepool": node_pool["metadata"]["name"],
    }
    for key, value in labels.items():
        out[key] = ("In", {value})
    return out


def _karpenter_compatible(node_pool: Manifest, term: Manifest) -> bool:
    """Whether Karpenter may launch a node of ``node_pool`` for a pod whose required node
    affinity is ``term`` (one nodeSelectorTerm; taints aside): every key the term requires
    is defined by the NodePool unless it is well known, and the values intersect."""
    defined = _requirements(node_pool)
    for expression in term["matchExpressions"]:
        key, operator = expression["key"], expression["operator"]
        values = set(expression.get("values", []))
        if key not in defined:
            if key in KARPENTER_WELL_KNOWN or operator in ("NotIn", "DoesNotExist"):
                continue
            return False  # "label ... does not have known values"
        pool_operator, pool_values = defined[key]
        if operator == "In" and pool_operator == "In" and not values & pool_values:
            return False
    return True


def _node_matches(labels: dict[str, str], term: Manifest) -> bool:
    """kube-scheduler's node selector term (In and Exists, as rendered)."""
    for expression in term["matchExpressions"]:
        value = labels.get(expression["key"])
        if value is None or (expression["operator"] == "In" and value not in expression["values"]):
            return False
    return True


def test_karpenter_never_launches_a_lending_pool_node_for_flex() -> None:
    """Karpenter tries the terms in order and relaxes to the next when one cannot be met; no
    term lets it launch a gpu-prod node (its taint is tolerated: the label stops it), while
    kube-scheduler admits gpu-prod nodes Karpenter has initialized."""
    objs = _objects(policy_with(), "karpenter")
    terms = _terms(_pod(objs))
    pools = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NodePool"}
    launchable = {
        name for name, pool in pools.items() for term in terms if _karpenter_compatible(pool, term)
    }
    assert launchable == {"gpu-flex"}
    running = {
        LABEL: "gpu-prod",
        "karpenter.sh/nodepool": "gpu-prod",
        KARPENTER_INITIALIZED: "true",
    }
    assert any(_node_matches(running, term) for term in terms)
    starting = {LABEL: "gpu-prod", "karpenter.sh/nodepool": "gpu-prod"}
    assert not any(_node_matches(starting, term) for term in terms)
    # Without the guard the second term would let Karpenter launch gpu-prod for flex.
    unguarded = {"matchExpressions": terms[1]["matchExpressions"][:1]}
    assert _karpenter_compatible(pools["gpu-prod"], unguarded)


def test_labels_target_nodes_need_no_karpenter_label() -> None:
    """Nodes the ``labels`` target declares carry the pool label only: the flex pods' one
    term admits them in both pools."""
    objs = _objects(policy_with(), "labels")
    (term,) = _terms(_pod(objs))
    nodes = [o for o in objs if o["kind"] == "Node"]
    assert {n["metadata"]["labels"][LABEL] for n in nodes} == {"gpu-flex", "gpu-prod"}
    for node in nodes:
        assert _node_matches(node["metadata"]["labels"], term), node["metadata"]["name"]
