"""Capacity alerts: production starved while flex holds GPUs, or flex not growing into room.

- ProdCapacityAtRisk: production pods that request GPUs are UNSCHEDULABLE (the scheduler
  found no node, preemption included) while flex pods run. A Pending pod that is already
  bound (pulling its image, running init containers) is not a capacity problem and never
  counts (``gpupool:prod_pods_pending``, kube-state-metrics' ``kube_pod_status_unschedulable``).
- FlexNotGrowing: per flex workload, the budget takes its grow step (production's GPU
  utilization below ``elastic.grow_while_production_below``), its flex pool has headroom
  for one replica of every workload sharing it, and its HPA is below ``maxReplicas``, for
  ``for``: the budget -> adapter -> HPA chain is broken. Not a tuner trigger: the tuner's only
  lever for idle flex GPUs is widening ``max_replicas`` (its ``idle-flex-demand`` rule), which
  cannot help an HPA that is below its bound; a person must look.
"""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import (
    BUDGET_LABEL,
    FLEX_BUDGET_STEP,
    FLEX_GPU_BUDGET,
    FLEX_HEADROOM_GPUS,
    FLEX_HPA_AT_MAX,
    FLEX_PODS_RUNNING,
    HPA_METRIC,
    PROD_PODS_PENDING,
    PRODUCTION_GPU_UTILIZATION,
    Catalogue,
)

GROW_SIGNAL = PRODUCTION_GPU_UTILIZATION
"""The recorded series the flex budget compares with ``elastic.grow_while_production_below``
(``BudgetChain.budget_step`` in the catalogue); FlexNotGrowing shows its value."""
GROWING = f'{FLEX_BUDGET_STEP}{{step="grow"}}'
"""The budget's grow step: FlexNotGrowing reads the budget's own decision, so it never fires
while the budget holds or sheds by design, and the threshold lives in one rule."""


def flex_not_growing_expr(policy: PoolPolicy) -> str:
    """One clause per workload: its HPA below max (value 0) plus the grow signal (value)
    while the budget's step is grow, where its pool's headroom fits a replica of each
    workload sharing the pool; labelled ``pool``. Empty without workloads (nothing could grow)."""
    clauses = []
    for w in policy.workloads:
        sharing = sum(1 for other in policy.workloads if other.pool == w.pool)
        need = sharing * w.gpus_per_replica
        clauses.append(
            f'label_replace(({FLEX_HPA_AT_MAX}{{{BUDGET_LABEL}="{w.name}"}} == 0)'
            f" + on () group_left () ({GROW_SIGNAL} and on () {GROWING})"
            f' and on () ({FLEX_HEADROOM_GPUS}{{pool="{w.pool}"}} >= {need}),'
            f' "pool", "{w.pool}", "", "")'
        )
    return " or ".join(clauses)


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    t = policy.alerting.thresholds
    low = policy.elastic.grow_while_production_below
    rules = [
        alert(
            "ProdCapacityAtRisk",
            f"{PROD_PODS_PENDING} > 0 and on () {FLEX_PODS_RUNNING} > 0",
            t.prod_capacity_at_risk,
            summary="Production pods that need GPUs cannot be scheduled while flex pods run.",
            description=(
                "{{ $value }} production pods (PriorityClass "
                f"{policy.priorities.production.name}) requesting {policy.metrics.gpu_resource} "
                f"have been unschedulable for {t.prod_capacity_at_risk.for_} while flex pods "
                f"run in {policy.cluster.flex_namespace}: preemption is not freeing GPUs."
            ),
        )
    ]
    if policy.workloads:
        rules.append(
            alert(
                "FlexNotGrowing",
                flex_not_growing_expr(policy),
                t.cluster_utilization_low,
                summary="Flex has room to grow and should, but does not.",
                description=(
                    "Production's GPU utilization is {{ $value | humanizePercentage }} "
                    f"(flex grows below {low:.0%}), flex pool {{{{ $labels.pool }}}} has "
                    "unallocated GPUs for a {{ $labels.workload }} replica and its HPA is "
                    f"below maxReplicas, for {t.cluster_utilization_low.for_}: the budget, "
                    "the adapter or the HPA is stuck. Check "
                    f'{FLEX_GPU_BUDGET}{{{BUDGET_LABEL}="{{{{ $labels.workload }}}}"}}, '
                    f"the HPA's events (External metric {HPA_METRIC}) and prometheus-adapter's "
                    "external rules."
                ),
            )
        )
    return [group("gpupool.capacity", policy, rules)]
