"""GPU node pools for the two provisioning targets: labels on existing nodes, or Karpenter.

``labels`` (self-managed and kind clusters): a Node patch per listed node sets the pool label
and, when the pool is tainted, the pool taint. ``karpenter``: one ``karpenter.sh/v1`` NodePool
per pool whose nodes carry the same label and taint, so workloads select pools the same way
whichever target provisions them.
"""

from __future__ import annotations

from typing import Literal

from infra.builders.meta import Manifest, labels
from policy import PoolPolicy
from policy.nodepools import NodePool

Target = Literal["labels", "karpenter"]
"""How node pools are declared; chosen in stack config (``gpupool:target``), not in code."""

TARGETS: tuple[Target, ...] = ("labels", "karpenter")
"""Every supported target, in documentation order."""

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource the NVIDIA device plugin advertises (kind: ``infra/kind/create.sh``)."""

TAINT_EFFECT = "NoSchedule"
"""Effect of the pool taint: keeps pods that do not tolerate the pool off its nodes."""


def pool_taint(policy: PoolPolicy, pool: NodePool) -> dict[str, str]:
    """The taint on a pool's nodes; flex workloads tolerate exactly this."""
    return {"key": policy.cluster.pool_label, "value": pool.name, "effect": TAINT_EFFECT}


def node_pools(policy: PoolPolicy, target: Target) -> list[Manifest]:
    """Objects that declare every pool for ``target``."""
    if target == "labels":
        return [node for pool in policy.node_pools for node in node_patches(policy, pool)]
    return [karpenter_node_pool(policy, pool) for pool in policy.node_pools]


def node_patches(policy: PoolPolicy, pool: NodePool) -> list[Manifest]:
    """Label (and taint) each listed existing node; gpupool never creates or deletes nodes.

    Applied with server-side apply (Pulumi ``NodePatch``, ``kubectl apply --server-side``) so
    only these fields are owned; the taint list is atomic, so other taints on these nodes must
    be declared by one owner.
    """
    out = []
    for node in pool.nodes:
        obj: Manifest = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {policy.cluster.pool_label: pool.name}},
        }
        if pool.taint:
            obj["spec"] = {"taints": [pool_taint(policy, pool)]}
        out.append(obj)
    return out


def karpenter_node_pool(policy: PoolPolicy, pool: NodePool) -> Manifest:
    """A ``karpenter.sh/v1`` NodePool bounded by the pool's GPU capacity."""
    settings = pool.karpenter
    requirements: list[Manifest] = [
        {
            "key": "karpenter.sh/capacity-type",
            "operator": "In",
            "values": list(settings.capacity_types),
        }
    ]
    if settings.instance_types:
        requirements.append(
            {
                "key": "node.kubernetes.io/instance-type",
                "operator": "In",
                "values": list(settings.instance_types),
            }
        )
    node_spec: Manifest = {
        "nodeClassRef": {
            "group": settings.node_class_group,
            "kind": settings.node_class_kind,
            "name": settings.node_class,
        },
        "requirements": requirements,
    }
    if pool.taint:
        node_spec["taints"] = [pool_taint(policy, pool)]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name, "labels": labels(f"node-pool-{pool.role}")},
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
