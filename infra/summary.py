"""What a bundle amounts to, as rows a person can read: pools, tiers, workloads, objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from infra.builders.meta import Manifest
from policy import PoolPolicy


@dataclass(frozen=True)
class Table:
    """A titled table of strings (the CLI prints it with rich)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def summarize(policy: PoolPolicy, objects: Sequence[Manifest]) -> list[Table]:
    """Pools, priority tiers, flex workloads with their derived numbers, and objects by kind."""
    flex_gpus = sum(p.gpu_capacity for p in policy.flex_pools)
    pools = Table(
        "Node pools",
        ("pool", "role", "GPU", "GPUs/node", "max nodes", "GPU capacity", "reserve"),
        tuple(
            (
                p.name,
                p.role,
                p.gpu_model,
                str(p.gpus_per_node),
                str(p.max_nodes),
                str(p.gpu_capacity),
                f"{p.reserve_ratio:.0%}",
            )
            for p in policy.node_pools
        ),
    )
    tiers = policy.priorities
    priorities = Table(
        "Priority tiers",
        ("tier", "PriorityClass", "value", "preemption"),
        tuple(
            (label, t.name, str(t.value), t.preemption_policy)
            for label, t in (
                ("production", tiers.production),
                ("training", tiers.training),
                ("idle inference", tiers.idle_inference),
            )
        ),
    )
    scaling, disruption = policy.autoscaling, policy.disruption
    workloads = Table(
        f"Flex workloads (flex GPU capacity {flex_gpus}; HPA up {scaling.scale_up_stabilization_s}"
        f" s / down {scaling.scale_down_stabilization_s} s; grace {disruption.termination_grace_s}"
        f" s >= shutdown budget {disruption.shutdown_budget_s} s)",
        ("workload", "pool", "GPUs/replica", "replicas", "peak GPUs", "PDB minAvailable"),
        tuple(
            (
                w.name,
                w.pool,
                str(w.gpus_per_replica),
                f"{w.min_replicas}-{policy.replica_bound(w)}",
                str(policy.replica_bound(w) * w.gpus_per_replica),
                str(disruption.pdb_min_available),
            )
            for w in policy.workloads
        ),
    )
    kinds = Counter(o["kind"] for o in objects)
    rendered = Table(
        f"Objects ({len(objects)})",
        ("kind", "count"),
        tuple((kind, str(n)) for kind, n in kinds.items()),
    )
    return [pools, priorities, workloads, rendered]
