"""Key fields of the built objects follow the policy (values read from the policy, not literals)."""

from __future__ import annotations

from collections import Counter

import pytest

from infra.builders.meta import Manifest
from infra.builders.stack_options import StackOptions
from infra.builders.vllm_container import (
    DRAIN_MARKER,
    DRAIN_VOLUME,
    poststart_command,
    prestop_command,
    readiness_command,
)
from infra.bundle import MissingVllmArgs, build_bundle, build_groups
from policy import PoolPolicy, load_policy
from tests.infra.policies import explicit_args, policy_with, two_workloads


def _bundle(policy: PoolPolicy, target: str = "labels") -> list[Manifest]:
    return build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))  # type: ignore[arg-type]


def _one(objs: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _vllm(pod: Manifest) -> Manifest:
    (found,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    return found


def test_priority_classes_follow_the_tiers() -> None:
    policy = policy_with({"priorities.idle_inference.value": -5})
    objs = _bundle(policy)
    tiers = policy.priorities
    values = {
        o["metadata"]["name"]: (o["value"], o["preemptionPolicy"])
        for o in objs
        if o["kind"] == "PriorityClass"
    }
    assert values == {
        t.name: (t.value, t.preemption_policy)
        for t in (tiers.production, tiers.training, tiers.idle_inference)
    }
    assert values[tiers.idle_inference.name] == (-5, "Never")
    assert not any(o.get("globalDefault") for o in objs if o["kind"] == "PriorityClass")


def test_flex_deployment_scheduling_and_shutdown() -> None:
    policy = policy_with(
        {
            "disruption.termination_grace_s": 120,
            "disruption.prestop_delay_s": 7,
            "workloads.0.snapshot_volume.mount_path": "/kv",
            "kv_cache.kv_preservation": "filesystem",
            "workloads.0.kv_compaction": False,
        }
    )
    objs = _bundle(policy)
    workload = policy.workloads[0]
    pod = _one(objs, "Deployment", workload.name)["spec"]["template"]["spec"]
    label = policy.cluster.pool_label
    assert pod["priorityClassName"] == policy.priorities.idle_inference.name
    assert "nodeSelector" not in pod  # the pools are the node affinity's (test_lending.py)
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["key"] == label
    assert workload.pool in term["matchExpressions"][0]["values"]
    assert {"key": label, "operator": "Equal", "value": workload.pool, "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    assert pod["terminationGracePeriodSeconds"] == 120
    container = _vllm(pod)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == prestop_command(7)
    assert container["lifecycle"]["postStart"]["exec"]["command"] == poststart_command()
    assert container["args"] == explicit_args(policy)[workload.name]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(workload.gpus_per_replica)
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["exec"]["command"] == readiness_command(
        workload.port, policy.disruption.readiness_period_s
    )
    assert (
        container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"]
        >= workload.startup_timeout_s
    )
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["kv-snapshots"] == "/kv"
    claim = next(v for v in pod["volumes"] if v["name"] == "kv-snapshots")
    pvc = _one(objs, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["storageClassName"] == workload.snapshot_volume.storage_class
    assert pvc["spec"]["resources"]["requests"]["storage"] == workload.snapshot_volume.size


@pytest.mark.parametrize(("period", "failures", "prestop"), [(1, 3, 5), (2, 2, 9), (1, 1, 2)])
def test_readiness_fails_within_the_prestop_sleep(period: int, failures: int, prestop: int) -> None:
    """The probe that reads the drain marker turns the pod unready before the preStop sleep
    ends, so routing drops it while vLLM still serves (docs/serving.md "The shutdown order")."""
    policy = policy_with(
        {
            "disruption.readiness_period_s": period,
            "disruption.readiness_failure_threshold": failures,
            "disruption.prestop_delay_s": prestop,
        }
    )
    pod = _one(_bundle(policy), "Deployment", policy.workloads[0].name)["spec"]["template"]["spec"]
    container = _vllm(pod)
    ready = container["readinessProbe"]
    assert (ready["periodSeconds"], ready["failureThreshold"]) == (period, failures)
    assert ready["timeoutSeconds"] <= ready["periodSeconds"]
    assert ready["periodSeconds"] * ready["failureThreshold"] < prestop
    assert DRAIN_MARKER in " ".join(ready["exec"]["command"])
    assert DRAIN_MARKER in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert container["lifecycle"]["preStop"]["exec"]["command"] == prestop_command(prestop)
    # the marker lives on the pod's own memory-backed emptyDir, mounted at the marker's dir
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == DRAIN_VOLUME]
    assert DRAIN_MARKER.startswith(mount["mountPath"] + "/")
    (volume,) = [v for v in pod["volumes"] if v["name"] == DRAIN_VOLUME]
    assert volume["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("mode", ["preferred", "required"])
def test_anti_affinity_spreads_replicas_across_zones(mode: str) -> None:
    """Both modes prefer the workload's replicas spread over zones, more weakly than they
    prefer packing onto nodes that run flex; ``required`` also refuses two replicas on one
    node (docs/design/lending.md)."""
    policy = policy_with({"disruption.anti_affinity": mode})
    dep = _one(_bundle(policy), "Deployment", policy.workloads[0].name)
    affinity = dep["spec"]["template"]["spec"]["affinity"]
    anti = affinity["podAntiAffinity"]
    selector = dep["spec"]["selector"]["matchLabels"]
    (weighted,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert weighted["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": selector},
        "topologyKey": "topology.kubernetes.io/zone",
    }
    (pack,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pack["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert 0 < weighted["weight"] < pack["weight"] <= 100
    if mode == "required":
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {
            "labelSelector": {"matchLabels": selector},
            "topologyKey": "kubernetes.io/hostname",
        }
    else:
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_pdb_and_hpa_follow_policy() -> None:
    policy = policy_with(
        {
            "disruption.pdb_min_available": 2,
            "workloads.0.min_replicas": 3,
            "autoscaling.scale_up_stabilization_s": 120,
            "autoscaling.scale_down_stabilization_s": 600,
            "autoscaling.scale_up_pods_per_minute": 3,
        }
    )
    objs = _bundle(policy)
    w = policy.workloads[0]
    pdb = _one(objs, "PodDisruptionBudget", w.name)["spec"]
    dep = _one(objs, "Deployment", w.name)
    assert pdb["minAvailable"] == 2
    assert pdb["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    hpa = _one(objs, "HorizontalPodAutoscaler", w.name)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": w.name}
    # max_replicas: auto, what the pools hold: gpu-flex 4 x 8 plus the lending gpu-prod 8 x 8
    assert w.max_replicas == "auto"
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (w.min_replicas, 96)
    assert hpa["maxReplicas"] == policy.replica_bound(w)
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 120
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert hpa["behavior"]["scaleUp"]["policies"] == [
        {"type": "Pods", "value": 3, "periodSeconds": 60}
    ]
    (metric,) = hpa["metrics"]
    assert metric["external"]["metric"] == {
        "name": "gpupool_flex_gpu_budget",
        "selector": {"matchLabels": {"workload": w.name}},
    }
    assert metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": str(w.gpus_per_replica),
    }


def test_default_hpa_windows_are_the_briefs() -> None:
    policy = load_policy()
    hpa = _one(_bundle(policy), "HorizontalPodAutoscaler", policy.workloads[0].name)["spec"]
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 180
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_every_workload_gets_its_own_objects() -> None:
    policy = two_workloads()
    objs = _bundle(policy)
    per_kind = Counter(
        o["kind"] for o in objs if o["metadata"].get("namespace") == policy.cluster.flex_namespace
    )
    assert per_kind["HorizontalPodAutoscaler"] == per_kind["PodDisruptionBudget"] == 2
    hpa = _one(objs, "HorizontalPodAutoscaler", "qwen-14b-flex")["spec"]
    assert hpa["metrics"][0]["external"]["target"]["averageValue"] == "2"
    groups = build_groups(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
    assert [g.name for g in groups if g.component == "gpupool:flex:InferenceWorkload"] == [
        "llama-8b-flex",
        "qwen-14b-flex",
    ]


def test_labels_target_patches_listed_nodes() -> None:
    policy = policy_with({"node_pools.1.nodes": ["gpu-a", "gpu-b"], "node_pools.0.taint": False})
    nodes = [o for o in _bundle(policy, "labels") if o["kind"] == "Node"]
    label = policy.cluster.pool_label
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {*policy.node_pools[0].nodes, "gpu-a", "gpu-b"}
    assert by_name["gpu-a"]["metadata"]["labels"] == {label: "gpu-flex"}
    assert by_name["gpu-a"]["spec"]["taints"] == [
        {"key": label, "value": "gpu-flex", "effect": "NoSchedule"}
    ]
    prod_node = by_name[policy.node_pools[0].nodes[0]]
    assert "spec" not in prod_node  # the prod pool is untainted in this policy
    assert not any(o["kind"] == "NodePool" for o in _bundle(policy, "labels"))


def test_karpenter_target_bounds_pools_by_gpu_capacity() -> None:
    policy = load_policy()
    pools = {
        o["metadata"]["name"]: o for o in _bundle(policy, "karpenter") if o["kind"] == "NodePool"
    }
    assert set(pools) == {p.name for p in policy.node_pools}
    for pool in policy.node_pools:
        spec = pools[pool.name]["spec"]
        assert spec["limits"] == {"nvidia.com/gpu": pool.max_nodes * pool.gpus_per_node}
        assert spec["template"]["metadata"]["labels"] == {policy.cluster.pool_label: pool.name}
        assert spec["disruption"]["consolidationPolicy"] == pool.karpenter.consolidation_policy
        assert spec["disruption"]["budgets"] == [{"nodes": pool.karpenter.disruption_budget_nodes}]
        capacity, *gpus = spec["template"]["spec"]["requirements"]
        assert capacity == {
            "key": "karpenter.sh/capacity-type",
            "operator": "In",
            "values": list(pool.karpenter.capacity_types),
        }
        assert [r["key"] for r in gpus] == [
            "karpenter.k8s.aws/instance-gpu-name",
            "karpenter.k8s.aws/instance-gpu-count",
            "karpenter.k8s.aws/instance-gpu-memory",
        ]
        assert spec["template"]["spec"]["expireAfter"] == pool.karpenter.expire_after
    assert not any(o["kind"] == "Node" for o in _bundle(policy, "karpenter"))


def test_rbac_is_least_privilege() -> None:
    """No pod gpupool renders calls the API: no Role, no binding, no token (test_security)."""
    policy = load_policy()
    objs = _bundle(policy)
    rbac = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    assert not [o for o in objs if o["kind"] in rbac]
    for name in ("gpupool-tuner", "gpupool-flex-inference"):
        assert _one(objs, "ServiceAccount", name)["automountServiceAccountToken"] is False
    tuner = _one(objs, "Deployment", "gpupool-tuner")["spec"]["template"]["spec"]
    (container,) = tuner["containers"]
    assert container["command"][:2] == ["gpupool", "tune"]
    assert policy.cluster.prometheus_url in container["command"]
    assert f"0.0.0.0:{policy.cluster.tuner_port}" in container["command"]


def test_missing_vllm_args_is_an_error() -> None:
    policy = load_policy()
    with pytest.raises(MissingVllmArgs, match="llama-8b-flex"):
        build_bundle(policy, stack=StackOptions("labels"), vllm_args={})
