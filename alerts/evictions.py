"""Eviction alerts: flex pods evicted too often mean the elastic thresholds are too aggressive."""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import FLEX_EVICTIONS, Catalogue, num


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.flex_eviction_rate
    return [
        group(
            "gpupool.evictions",
            policy,
            [
                alert(
                    "FlexEvictionRateHigh",
                    f"{FLEX_EVICTIONS} > {num(knobs.per_minute_max)}",
                    knobs,
                    summary="Flex pods are evicted too often.",
                    description=(
                        "Flex pods in {{ $labels.namespace }} are evicted or preempted "
                        "{{ $value | humanize }} times per minute (limit "
                        f"{knobs.per_minute_max:g} per minute for {knobs.for_}): the elastic "
                        "thresholds are too aggressive; relax the reserve."
                    ),
                    tuner_trigger=True,
                )
            ],
        )
    ]
