"""Capacity alerts: production starved while flex holds GPUs, or idle GPUs flex does not use."""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import (
    CLUSTER_GPU_UTILIZATION,
    FLEX_HEADROOM_GPUS,
    FLEX_PODS_RUNNING,
    PROD_PODS_PENDING,
    Catalogue,
    num,
)


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    t = policy.alerting.thresholds
    low = policy.elastic.scale_up_below
    return [
        group(
            "gpupool.capacity",
            policy,
            [
                alert(
                    "ProdCapacityAtRisk",
                    f"{PROD_PODS_PENDING} > 0 and on () {FLEX_PODS_RUNNING} > 0",
                    t.prod_capacity_at_risk,
                    summary="Production pods are pending while flex pods hold GPUs.",
                    description=(
                        "{{ $value }} production pods (PriorityClass "
                        f"{policy.priorities.production.name}) have been pending for "
                        f"{t.prod_capacity_at_risk.for_} while flex pods run in "
                        f"{policy.cluster.flex_namespace}: preemption is not freeing GPUs."
                    ),
                ),
                alert(
                    "ClusterGPUUtilizationLow",
                    f"{CLUSTER_GPU_UTILIZATION} < {num(low)}"
                    f" and on () sum({FLEX_HEADROOM_GPUS}) >= 1",
                    t.cluster_utilization_low,
                    summary="GPUs sit idle but flex capacity is not growing.",
                    description=(
                        "Cluster GPU utilization is {{ $value | humanizePercentage }} (flex "
                        f"should grow below {low:.0%}) and flex pools have idle GPUs for "
                        f"{t.cluster_utilization_low.for_}: check the flex HPAs, their "
                        "max_replicas and the external metric."
                    ),
                    tuner_trigger=True,
                ),
            ],
        )
    ]
