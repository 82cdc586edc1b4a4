"""GPU node pools for the two provisioning targets: labels on existing nodes, or Karpenter.

``labels`` (self-managed and kind clusters): a Node patch per listed node sets the pool label
and the pool's whole taint list (``node_taints``). ``karpenter``: one ``karpenter.sh/v1``
NodePool per pool whose nodes carry the same label and taints and whose requirements select
the pool's GPUs, so workloads select pools the same way whichever target provisions them.

Neither target lets a sync delete what it declares: a Node patch and a NodePool are never
pruned or deleted by Argo CD or Flux (``NODE_PATCH_ANNOTATIONS``, ``RETAIN_ANNOTATIONS``), and
Pulumi declares Nodes as ``NodePatch`` (server-side apply), which gives fields back on delete
and never deletes the Node.
"""

from __future__ import annotations

from infra.builders.meta import RETAIN_ANNOTATIONS, Manifest, labels
from infra.builders.stack_options import Target
from policy import PoolPolicy
from policy.karpenter import NodeRequirement
from policy.nodepools import POOL_TAINT_EFFECT, NodePool

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource the NVIDIA device plugin advertises (kind: ``infra/kind/create.sh``)."""

TAINT_EFFECT = POOL_TAINT_EFFECT
"""Effect of the pool taint: keeps pods that do not tolerate the pool off its nodes."""

_ARGOCD_SYNC_OPTIONS = "argocd.argoproj.io/sync-options"

NODE_PATCH_ANNOTATIONS = {
    **RETAIN_ANNOTATIONS,
    # Argo CD: never prune or delete (RETAIN_ANNOTATIONS) and apply server-side: the object
    # is a partial Node, a patch of one the cluster already has.
    _ARGOCD_SYNC_OPTIONS: f"{RETAIN_ANNOTATIONS[_ARGOCD_SYNC_OPTIONS]},ServerSideApply=true",
    # Flux applies server-side always; `merge` is its documented way to patch an object it
    # did not create, leaving the fields other managers own (the kubelet's) to them.
    "kustomize.toolkit.fluxcd.io/ssa": "merge",
}
"""Annotations of every rendered Node patch: GitOps tools patch the Node, never delete it."""


def pool_taint(policy: PoolPolicy, pool: NodePool) -> dict[str, str]:
    """The pool taint (``<pool_label>=<pool>:NoSchedule``); flex workloads tolerate exactly this."""
    return {"key": policy.cluster.pool_label, "value": pool.name, "effect": TAINT_EFFECT}


def node_taints(policy: PoolPolicy, pool: NodePool) -> list[dict[str, str]]:
    """The whole taint list of the pool's nodes: the pool taint (when ``taint``), then
    ``taints``. Both targets write exactly this; the list is atomic, so it is one owner's."""
    out = [pool_taint(policy, pool)] if pool.taint else []
    for taint in pool.taints:
        value = {"value": taint.value} if taint.value else {}
        out.append({"key": taint.key, **value, "effect": taint.effect})
    return out


def node_pools(policy: PoolPolicy, target: Target) -> list[Manifest]:
    """Objects that declare every pool for ``target``."""
    if target == "labels":
        return [node for pool in policy.node_pools for node in node_patches(policy, pool)]
    return [karpenter_node_pool(policy, pool) for pool in policy.node_pools]


def node_patches(policy: PoolPolicy, pool: NodePool) -> list[Manifest]:
    """Label each listed existing node and write its taint list; gpupool never creates or
    deletes nodes.

    Applied with server-side apply (Pulumi ``NodePatch``, Argo CD ``ServerSideApply=true``,
    Flux, ``kubectl apply --server-side``) so only these fields are gpupool's. ``spec.taints``
    is an atomic list: when the pool declares taints the patch owns all of the node's taints
    (``node_taints``); when it declares none the patch leaves the list alone.
    """
    taints = node_taints(policy, pool)
    out = []
    for node in pool.nodes:
        obj: Manifest = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "labels": {policy.cluster.pool_label: pool.name},
                "annotations": dict(NODE_PATCH_ANNOTATIONS),
            },
        }
        if taints:
            obj["spec"] = {"taints": taints}
        out.append(obj)
    return out


def _requirement(req: NodeRequirement) -> Manifest:
    out: Manifest = {"key": req.key, "operator": req.operator}
    if req.values:
        out["values"] = list(req.values)
    if req.min_values is not None:
        out["minValues"] = req.min_values
    return out


def karpenter_node_pool(policy: PoolPolicy, pool: NodePool) -> Manifest:
    """A ``karpenter.sh/v1`` NodePool bounded by the pool's GPU capacity.

    Kept by Argo CD and Flux like a namespace (``RETAIN_ANNOTATIONS``): deleting a NodePool
    makes Karpenter drain and terminate every node it launched, production's included.
    """
    settings = pool.karpenter
    group, kind, name = settings.node_class_ref
    node_spec: Manifest = {
        "nodeClassRef": {"group": group, "kind": kind, "name": name},
        "requirements": [_requirement(r) for r in pool.karpenter_requirements],
        "expireAfter": settings.expire_after,
    }
    if settings.termination_grace_period is not None:
        node_spec["terminationGracePeriod"] = settings.termination_grace_period
    taints = node_taints(policy, pool)
    if taints:
        node_spec["taints"] = taints
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {
            "name": pool.name,
            "labels": labels(f"node-pool-{pool.role}"),
            "annotations": dict(RETAIN_ANNOTATIONS),
        },
        "spec": {
            "template": {
                "metadata": {"labels": {policy.cluster.pool_label: pool.name}},
                "spec": node_spec,
            },
            "limits": {GPU_RESOURCE: pool.gpu_capacity},
            "disruption": {
                "consolidationPolicy": settings.consolidation_policy,
                "consolidateAfter": settings.consolidate_after,
                "budgets": [{"nodes": settings.disruption_budget_nodes}],
            },
        },
    }
