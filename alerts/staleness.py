"""Absent-metrics alert: decisions fail closed on missing data, so missing data must be loud."""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.metrics_stale
    rules = []
    for source in catalogue.sources:
        rule = alert(
            "GpupoolMetricsStale",
            f"absent({source.selector})",
            knobs,
            summary=f"No {source.name} metrics: gpupool is deciding blind.",
            description=(
                f"Prometheus has had no {source.selector} series for {knobs.for_}; "
                f"{source.name} is down or no longer scraped. The flex HPA holds and the "
                "tuner proposes nothing until it is back."
            ),
        )
        rule["labels"]["source"] = source.name
        rules.append(rule)
    return [group("gpupool.staleness", policy, rules)]
