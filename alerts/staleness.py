"""Absent-metrics alerts: decisions fail closed on missing data, so missing data must be loud.

Both follow ``catalogue.sources``, the one list of the exporters gpupool reads:

- GpupoolMetricsStale (label ``source``): an exporter's liveness series is absent, so it is
  down or no longer scraped.
- GpupoolMetricMissing (labels ``source``, ``metric``): the exporter runs, but a series the
  catalogue needs from it is missing (a kube-state-metrics resource or a DCGM counter
  switched off, a ``metrics.dcgm_job`` matching no scrape job).
"""

from __future__ import annotations

import re

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue


def _metric(selector: str) -> str:
    match = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", selector)
    assert match is not None, selector
    return match.group(0)


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.metrics_stale
    missing = policy.alerting.thresholds.metric_missing
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
    for source in catalogue.sources:
        for need in source.requires:
            rule = alert(
                "GpupoolMetricMissing",
                f"absent({need.selector}) and on () count({source.selector}) > 0",
                missing,
                summary=f"{source.name} runs without a series gpupool needs.",
                description=(
                    f"{source.name} is up ({source.selector} present) but Prometheus has had "
                    f"no {need.selector} series for {missing.for_}: {need.fix}."
                ),
            )
            rule["labels"] |= {"source": source.name, "metric": _metric(need.selector)}
            rules.append(rule)
    return [group("gpupool.staleness", policy, rules)]
