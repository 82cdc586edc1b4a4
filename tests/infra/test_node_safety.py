"""Nodes are handled safely: no sync deletes a Node or a NodePool, and taints have one owner.

Node patches (``labels`` target) and Karpenter NodePools carry the Argo CD and Flux keep
annotations in the rendered YAML and in what Pulumi registers; the node's taint list is
written whole from the policy, and every taint it holds is tolerated by gpupool's pods.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pulumi
import pytest
from ruamel.yaml import YAML

from infra.builders.meta import Manifest
from infra.builders.production import patched_pod_spec
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.render import render_documents
from policy import PoolPolicy
from runtime.cli.app import app
from tests.infra.policies import edited, explicit_args, policy_with
from tests.infra.test_cli import runner, write_policy
from tests.infra.test_program import Recorder, _declare, pulumi_test

ARGO = "argocd.argoproj.io/sync-options"
FLUX_PRUNE = "kustomize.toolkit.fluxcd.io/prune"
FLUX_SSA = "kustomize.toolkit.fluxcd.io/ssa"

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SOFT_TAINT = {"key": "example.com/maintenance", "effect": "PreferNoSchedule"}


def _objects(policy: PoolPolicy, target: str, kind: str) -> list[Manifest]:
    objs = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    return [o for o in objs if o["kind"] == kind]


def _rendered(policy: PoolPolicy, target: str, kind: str) -> list[Manifest]:
    """The objects of ``kind`` as a GitOps tool reads them: parsed back from rendered YAML."""
    objs = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]
    docs = [YAML(typ="safe").load(text) for text in render_documents(objs).values()]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == kind]


def _tolerates(tolerations: list[Manifest], taint: Manifest) -> bool:
    """Kubernetes' rule: a toleration matches a taint by key (or empty key with Exists),
    value (Equal) and effect (empty tolerates every effect)."""
    for tol in tolerations:
        key_ok = tol.get("key", "") in ("", taint["key"])
        if tol.get("operator", "Equal") == "Exists":
            value_ok = True
        else:
            value_ok = tol.get("value", "") == taint.get("value", "")
        effect_ok = tol.get("effect", "") in ("", taint["effect"])
        if key_ok and value_ok and effect_ok:
            return True
    return False


def _admits(tolerations: list[Manifest], taints: list[Manifest]) -> bool:
    """A pod with ``tolerations`` may be scheduled and stay on a node with ``taints``
    (a ``PreferNoSchedule`` taint only lowers the node's score)."""
    return all(t["effect"] == "PreferNoSchedule" or _tolerates(tolerations, t) for t in taints)


@pytest.fixture
def policy() -> PoolPolicy:
    return policy_with({"node_pools.0.taints": [GPU_TAINT, SOFT_TAINT]})


def test_node_patches_are_never_pruned_or_deleted_and_apply_server_side(
    policy: PoolPolicy,
) -> None:
    nodes = _rendered(policy, "labels", "Node")
    assert {n["metadata"]["name"] for n in nodes} == {n for p in policy.node_pools for n in p.nodes}
    for node in nodes:
        annotations = node["metadata"]["annotations"]
        assert annotations[ARGO] == "Prune=false,Delete=false,ServerSideApply=true"
        assert annotations[FLUX_PRUNE] == "disabled"
        assert annotations[FLUX_SSA] == "merge"


def test_karpenter_node_pools_are_never_pruned_or_deleted(policy: PoolPolicy) -> None:
    pools = _rendered(policy, "karpenter", "NodePool")
    assert {p["metadata"]["name"] for p in pools} == {p.name for p in policy.node_pools}
    for pool in pools:
        annotations = pool["metadata"]["annotations"]
        assert annotations[ARGO] == "Prune=false,Delete=false"
        assert annotations[FLUX_PRUNE] == "disabled"
        assert FLUX_SSA not in annotations  # gpupool owns the whole NodePool: Flux may force
    assert not _rendered(policy, "karpenter", "Node")


RECORDER = Recorder()


@pytest.fixture(autouse=True)
def fresh_recorder() -> Recorder:
    RECORDER.registered.clear()
    pulumi.runtime.set_mocks(RECORDER, preview=False)
    return RECORDER


@pytest.mark.parametrize("target", ["labels", "karpenter"])
@pulumi_test
def test_pulumi_patches_nodes_and_keeps_the_annotations(target: str) -> pulumi.Output[None]:
    """Pulumi never creates or deletes a Node (``NodePatch``: server-side apply, fields given
    back on delete) and registers the same annotations the GitOps files carry."""
    policy = policy_with({"node_pools.0.taints": [GPU_TAINT]})
    expected = {
        o["metadata"]["name"]: o
        for o in _objects(policy, target, "Node" if target == "labels" else "NodePool")
    }

    def check(_: Any) -> None:
        kind = "core/v1:NodePatch" if target == "labels" else "karpenter.sh/v1:NodePool"
        got = {
            inputs["metadata"]["name"]: inputs
            for typ, _name, inputs in RECORDER.registered
            if typ == f"kubernetes:{kind}"
        }
        assert set(got) == set(expected)
        assert not [t for t, _, _ in RECORDER.registered if t == "kubernetes:core/v1:Node"]
        for name, obj in expected.items():
            assert got[name]["metadata"]["annotations"][FLUX_PRUNE] == "disabled"
            assert got[name]["metadata"] == obj["metadata"]
            assert got[name]["spec"] == obj["spec"]

    return _declare(policy, target).apply(check)


def test_the_patch_writes_the_whole_declared_taint_list(policy: PoolPolicy) -> None:
    label = policy.cluster.pool_label
    pool_taint = {"key": label, "value": "gpu-prod", "effect": "NoSchedule"}
    whole = [pool_taint, GPU_TAINT, SOFT_TAINT]
    (prod_node,) = [
        n for n in _rendered(policy, "labels", "Node") if n["metadata"]["name"] == "gpupool-worker"
    ]
    assert prod_node["spec"] == {"taints": whole}
    (prod_pool,) = [
        p for p in _rendered(policy, "karpenter", "NodePool") if p["metadata"]["name"] == "gpu-prod"
    ]
    assert prod_pool["spec"]["template"]["spec"]["taints"] == whole


def test_a_pool_without_taints_leaves_the_node_taint_list_alone() -> None:
    policy = policy_with({"node_pools.0.taint": False})
    (prod_node,) = [
        n for n in _objects(policy, "labels", "Node") if n["metadata"]["name"] == "gpupool-worker"
    ]
    assert "spec" not in prod_node  # no taints declared: the patch does not own the list
    (prod_pool,) = [
        p for p in _objects(policy, "karpenter", "NodePool") if p["metadata"]["name"] == "gpu-prod"
    ]
    assert "taints" not in prod_pool["spec"]["template"]["spec"]


@pytest.mark.parametrize("target", ["labels", "karpenter"])
def test_gpupool_pods_tolerate_every_taint_their_pools_carry(
    policy: PoolPolicy, target: str
) -> None:
    """The premise of the taint rule: flex pods tolerate every taint of the nodes of each
    pool their required node affinity admits (their flex pool and each pool that lends),
    production pods every taint of every pool."""
    if target == "labels":
        taints = {
            n["metadata"]["name"]: n["spec"]["taints"] for n in _objects(policy, target, "Node")
        }
        by_pool = {p.name: taints[p.nodes[0]] for p in policy.node_pools}
    else:
        by_pool = {
            p["metadata"]["name"]: p["spec"]["template"]["spec"]["taints"]
            for p in _objects(policy, target, "NodePool")
        }
    production = patched_pod_spec(policy, {})["tolerations"]
    assert len(by_pool["gpu-prod"]) == 3
    for taints in by_pool.values():
        assert _admits(production, taints)
    flex = 0
    for deployment in _objects(policy, target, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        node = pod.get("affinity", {}).get("nodeAffinity", {})
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if required is None or pod["priorityClassName"] != policy.priorities.idle_inference.name:
            continue
        flex += 1
        pools = {
            value
            for term in required["nodeSelectorTerms"]
            for expression in term["matchExpressions"]
            if expression["key"] == policy.cluster.pool_label
            for value in expression["values"]
        }
        assert pools == {"gpu-flex", "gpu-prod"}  # the shipped gpu-prod lends
        for pool in pools:
            assert _admits(pod["tolerations"], by_pool[pool]), pool
    assert flex == len(policy.workloads)
    assert not _admits(production, [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])


BAD_TAINTS = {
    "repeated": (
        [GPU_TAINT, {**GPU_TAINT, "value": "true"}],
        "node_pools.0.taints.1",
        "taint nvidia.com/gpu:NoSchedule is repeated",
    ),
    "not tolerated": (
        [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
        "node_pools.0.taints.0",
        "would keep them off the pool",
    ),
    "bad effect": (
        [{"key": "dedicated", "effect": "Sometimes"}],
        "node_pools.0.taints.0.effect",
        "Input should be 'NoSchedule', 'PreferNoSchedule' or 'NoExecute'",
    ),
    "bad key": (
        [{"key": "no spaces/allowed", "effect": "PreferNoSchedule"}],
        "node_pools.0.taints.0.key",
        "expected a label key",
    ),
    "bad value": (
        [{"key": "nvidia.com/gpu", "value": "a" * 64, "effect": "NoSchedule"}],
        "node_pools.0.taints.0.value",
        "expected a label value (at most 63",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TAINTS))
def test_bad_taints_are_located_errors_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    taints, path, words = BAD_TAINTS[case]
    source = write_policy(tmp_path, edited({"node_pools.0.taints": taints}))
    out = tmp_path / "build"
    result = runner.invoke(app, ["render", str(source), "--out", str(out)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if f": {path}: " in ln]
    match = re.match(rf"{re.escape(str(source))}:(\d+): ", line)
    assert match, line
    assert words in line
    assert int(match.group(1)) == yaml_line(source, path)
    assert not out.exists()


def yaml_line(source: Path, path: str) -> int:
    """1-based line of the node at dotted ``path`` in ``source``, from ruamel's own marks."""
    *parents, last = path.split(".")
    node: Any = YAML(typ="rt").load(source.read_text())
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    line = node.lc.item(int(last))[0] if last.isdigit() else node.lc.key(last)[0]
    return int(line) + 1
