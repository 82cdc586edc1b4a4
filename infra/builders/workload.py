"""One flex vLLM workload: Deployment, snapshot PVC, Service, PodDisruptionBudget and HPA
(and, with ``model_cache.storage_class``, the shared model-cache PVC).

The HPA scales on ``catalogue.HPA_METRIC`` (``gpupool_flex_gpu_budget``), an External metric
that prometheus-adapter serves from the recording rule ``catalogue.FLEX_GPU_BUDGET``
(``gpupool:flex_gpu_budget``, label ``catalogue.BUDGET_LABEL``); its value is the number of
GPUs the workload may occupy right now. With an ``AverageValue`` target of
``gpus_per_replica`` the HPA's desired replica count is ``ceil(budget / gpus_per_replica)``,
clamped to the workload's replica bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from infra.builders.compaction_sidecar import (
    METRICS_PORT,
    compaction_service_name,
    compaction_sidecar,
    compaction_volumes,
    plugin_installer,
)
from infra.builders.hpa import horizontal_pod_autoscaler, rate_limit, scaling_rule
from infra.builders.meta import PART_OF, Manifest, metadata, selector_labels
from infra.builders.nodepools import GPU_RESOURCE, TAINT_EFFECT
from infra.builders.pod import pod_security, pull_secrets
from infra.builders.rbac import FLEX_SERVICE_ACCOUNT
from infra.builders.snapshot_gc import (
    preserving,
    snapshot_claim_name,
    snapshot_gc,
    snapshot_volumes,
)
from infra.builders.stack_options import DEFAULT_STACK, HpaTolerance, StackOptions, Target
from infra.builders.vllm_container import (
    HTTP_PORT,
    model_cache_claim_name,
    vllm_container,
    vllm_volumes,
)
from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.metrics import catalogue

COMPONENT = "flex-inference"
"""``app.kubernetes.io/component`` of every flex workload object."""

HOSTNAME_KEY = "kubernetes.io/hostname"
"""Node label naming the node: the topology of packing and of ``anti_affinity: required``."""

ZONE_KEY = "topology.kubernetes.io/zone"
"""Node label naming the failure domain: the topology a workload's replicas spread over."""

PREFER_OWN_POOL_WEIGHT = 100
"""Weight of the preferred node affinity on the workload's own flex pool (the largest)."""

PACK_WEIGHT = 100
"""Weight of the preferred pod affinity toward nodes already running flex pods (the
largest): flex fills nodes that run flex before empty ones (docs/design/lending.md)."""

ZONE_SPREAD_WEIGHT = 50
"""Weight of the preferred anti-affinity among one workload's replicas per zone, half of
``PACK_WEIGHT``: a node already running F flex pods stays first until its zone holds 2F
more of the workload's replicas than another zone (docs/design/lending.md)."""

KARPENTER_INITIALIZED = "karpenter.sh/initialized"
"""Label Karpenter puts on a node it launched once the node is ready (GPUs registered).
No NodePool can promise it, so Karpenter never provisions a node for a term requiring it,
while kube-scheduler places pods on the nodes that carry it: flex pods reach a lending
pool's existing nodes only (``karpenter`` target, docs/design/lending.md)."""

BEHAVIOR_TOLERANCE = "0"
"""``tolerance`` of both directions under ``behavior``: the budget is a whole number of GPUs,
so any difference from the current replicas is a decision, never noise."""

RATE_PERIOD_S = 60
"""HPA policy period: the policy's ``*_pods_per_minute`` limits are per 60 s."""


def flex_workload(
    policy: PoolPolicy,
    workload: FlexWorkload,
    vllm_args: Sequence[str],
    stack: StackOptions = DEFAULT_STACK,
    pod_labels: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """Every object of one flex workload, in apply order; ``pod_labels`` join its pods to
    the serving layer's pools (``infra.builders.serving_pools.flex_pod_labels``); of the
    stack's options the node-pool target places the pods (``flex_node_affinity``) and the
    HPA tolerance goes on the HPA (``autoscaler``)."""
    compaction = [compaction_service(policy, workload)] if workload.kv_compaction else []
    cache = [model_cache_claim(policy, workload)] if workload.model_cache.storage_class else []
    snapshots = [snapshot_claim(policy, workload)] if preserving(policy) else []
    return [
        *snapshots,
        *cache,
        deployment(policy, workload, vllm_args, pod_labels, stack.target),
        service(policy, workload),
        *compaction,
        disruption_budget(policy, workload),
        autoscaler(policy, workload, stack.hpa_tolerance),
    ]


def _meta(policy: PoolPolicy, name: str, workload: FlexWorkload) -> Manifest:
    return metadata(
        name, COMPONENT, namespace=policy.cluster.flex_namespace, instance=workload.name
    )


def snapshot_claim(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """Shared volume for KV snapshots, so a replacement replica can restore its prefix cache."""
    volume = workload.snapshot_volume
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(policy, snapshot_claim_name(workload), workload),
        "spec": {
            "accessModes": [volume.access_mode],
            "storageClassName": volume.storage_class,
            "resources": {"requests": {"storage": volume.size}},
        },
    }


def model_cache_claim(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """ReadWriteMany volume for ``HF_HOME`` that every replica shares: a replica that
    replaces an evicted one loads the weights from it instead of downloading them again."""
    cache = workload.model_cache
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(policy, model_cache_claim_name(workload), workload),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cache.storage_class,
            "resources": {"requests": {"storage": cache.size}},
        },
    }


def flex_tolerations(policy: PoolPolicy, workload: FlexWorkload) -> list[Manifest]:
    """The pool taint of every tainted pool ``workload`` may use (its flex pool, then each
    pool that lends), then the common ``nvidia.com/gpu`` taint."""
    return [
        *(
            {
                "key": policy.cluster.pool_label,
                "operator": "Equal",
                "value": pool.name,
                "effect": TAINT_EFFECT,
            }
            for pool in policy.pools_for(workload)
            if pool.taint
        ),
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": TAINT_EFFECT},
    ]


def _pool_term(policy: PoolPolicy, pools: Sequence[str], *more: Manifest) -> Manifest:
    expression = {"key": policy.cluster.pool_label, "operator": "In", "values": list(pools)}
    return {"matchExpressions": [expression, *more]}


def flex_node_affinity(policy: PoolPolicy, workload: FlexWorkload, target: Target) -> Manifest:
    """Required: one of the pools ``workload`` may use (``PoolPolicy.pools_for``); preferred,
    weight 100, its own flex pool when another pool lends.

    On the ``karpenter`` target the lending pools are a second ``nodeSelectorTerm`` that
    also requires ``KARPENTER_INITIALIZED``: kube-scheduler ORs the terms, so flex lands on
    the lending pools' running nodes, but no NodePool can satisfy that term, so a pending
    flex pod makes Karpenter provision its flex pool (the first term) and never a
    production node (docs/design/lending.md, "Karpenter").
    """
    own = policy.pool_of(workload).name
    lending = [p.name for p in policy.pools_for(workload) if p.name != own]
    if not lending:
        return {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [_pool_term(policy, [own])]
            }
        }
    if target == "karpenter":
        ready = {"key": KARPENTER_INITIALIZED, "operator": "In", "values": ["true"]}
        terms = [_pool_term(policy, [own]), _pool_term(policy, lending, ready)]
    else:
        terms = [_pool_term(policy, [own, *lending])]
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": PREFER_OWN_POOL_WEIGHT, "preference": _pool_term(policy, [own])}
        ],
    }


def flex_pod_affinity() -> Manifest:
    """Preferred (``PACK_WEIGHT``): a node already running pods of any flex workload, so
    flex packs onto few nodes and what it gives back is whole free nodes. The term selects
    pods in the pod's own namespace, ``cluster.flex_namespace``, where every flex pod runs."""
    flex = {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": COMPONENT}
    term = {"labelSelector": {"matchLabels": flex}, "topologyKey": HOSTNAME_KEY}
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": PACK_WEIGHT, "podAffinityTerm": term}
        ]
    }


def deployment(
    policy: PoolPolicy,
    workload: FlexWorkload,
    vllm_args: Sequence[str],
    pod_labels: Mapping[str, str] | None = None,
    target: Target = "labels",
) -> Manifest:
    """The vLLM Deployment: lowest priority, on its flex pool or a pool that lends (the flex
    pool preferred), packed onto nodes that run flex, spread over zones, drained on eviction.

    ``replicas`` is left out: the HPA owns it, and a rendered value would fight the HPA on
    every sync. With ``workload.kv_compaction`` the pod also gets the plugin's initContainer,
    the compaction sidecar and their volumes (``infra.builders.compaction_sidecar``).
    """
    selector = selector_labels(workload.name)
    pod_meta = _meta(policy, workload.name, workload)
    pod_meta["labels"] |= {**(pod_labels or {}), **selector}
    del pod_meta["name"], pod_meta["namespace"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "selector": {"matchLabels": selector},
            # A surge replica would need a free GPU; replace one at a time instead.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": pod_meta,
                "spec": _pod_spec(policy, workload, vllm_args, selector, target),
            },
        },
    }


def _pod_spec(
    policy: PoolPolicy,
    workload: FlexWorkload,
    vllm_args: Sequence[str],
    selector: dict[str, str],
    target: Target,
) -> Manifest:
    """The flex pod: its priority, placement and grace period, vLLM and (with compaction or
    preservation) the sidecar beside it."""
    containers = [vllm_container(policy, workload, vllm_args)]
    volumes = vllm_volumes(workload)
    sidecar: Manifest = {}
    if workload.kv_compaction:
        containers.append(compaction_sidecar(policy, workload))
        volumes += compaction_volumes(policy, workload)
        sidecar["initContainers"] = [plugin_installer(policy)]
    elif preserving(policy):
        containers.append(snapshot_gc(policy, workload))
        volumes += snapshot_volumes(workload)
        sidecar["initContainers"] = [plugin_installer(policy)]
    return {
        "priorityClassName": policy.priorities.idle_inference.name,
        "serviceAccountName": FLEX_SERVICE_ACCOUNT,
        # neither vLLM nor the sidecar calls the Kubernetes API
        "automountServiceAccountToken": False,
        **pull_secrets(policy),
        "tolerations": flex_tolerations(policy, workload),
        "affinity": {
            "nodeAffinity": flex_node_affinity(policy, workload, target),
            "podAffinity": flex_pod_affinity(),
            "podAntiAffinity": _anti_affinity(policy, selector),
        },
        "terminationGracePeriodSeconds": policy.disruption.termination_grace_s,
        "securityContext": pod_security(),
        **sidecar,
        "containers": containers,
        "volumes": volumes,
    }


def _anti_affinity(policy: PoolPolicy, selector: dict[str, str]) -> Manifest:
    """Preferred (``ZONE_SPREAD_WEIGHT``): the workload's replicas over zones. With
    ``disruption.anti_affinity: required`` also at most one replica per node."""
    zone = {"labelSelector": {"matchLabels": selector}, "topologyKey": ZONE_KEY}
    out: Manifest = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": ZONE_SPREAD_WEIGHT, "podAffinityTerm": zone}
        ]
    }
    if policy.disruption.anti_affinity == "required":
        node = {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_KEY}
        out["requiredDuringSchedulingIgnoredDuringExecution"] = [node]
    return out


def service(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """ClusterIP Service in front of the replicas (the router sends flex traffic here)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(workload.name),
            "ports": [
                {
                    "name": HTTP_PORT,
                    "port": workload.port,
                    "targetPort": HTTP_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def compaction_service(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """Headless Service on the sidecars' port: its DNS name resolves to every ready pod, so
    the tuner can post a compaction request to each without RBAC to list pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(policy, compaction_service_name(workload), workload),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(workload.name),
            "ports": [
                {
                    "name": METRICS_PORT,
                    "port": policy.kv_cache.compaction_sidecar_port,
                    "targetPort": METRICS_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def disruption_budget(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """PDB: voluntary evictions (drains, Karpenter consolidation) keep ``minAvailable`` up.

    Preemption by higher-priority pods ignores PDBs by design: that is how flex yields.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "minAvailable": policy.disruption.pdb_min_available,
            "selector": {"matchLabels": selector_labels(workload.name)},
            # A crash-looping replica must not block node drains.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def autoscaler(
    policy: PoolPolicy, workload: FlexWorkload, tolerance: HpaTolerance = "cluster"
) -> Manifest:
    """autoscaling/v2 HPA on the GPU budget, with the policy's stabilization windows."""
    scaling = policy.autoscaling
    per_hpa = {"tolerance": BEHAVIOR_TOLERANCE} if tolerance == "behavior" else {}
    budget = {
        "type": "External",
        "external": {
            "metric": {
                "name": catalogue.HPA_METRIC,
                "selector": {"matchLabels": {catalogue.BUDGET_LABEL: workload.name}},
            },
            "target": {"type": "AverageValue", "averageValue": str(workload.gpus_per_replica)},
        },
    }
    up = rate_limit("Pods", scaling.scale_up_pods_per_minute, RATE_PERIOD_S)
    down = rate_limit("Pods", scaling.scale_down_pods_per_minute, RATE_PERIOD_S)
    return horizontal_pod_autoscaler(
        _meta(policy, workload.name, workload),
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload.name},
        (workload.min_replicas, policy.replica_bound(workload)),
        budget,
        scaling_rule(scaling.scale_up_stabilization_s, [up], per_hpa),
        scaling_rule(scaling.scale_down_stabilization_s, [down], per_hpa),
    )
