"""Eviction alerts: flex pods evicted too often mean the elastic thresholds are too aggressive.

The recorded rate is split by canonical ``reason`` (runtime/metrics/evictions.py); the alert
sums the reasons per namespace, so its identity does not change with the mix, and its
description lists the split so the receiver knows which remedy of the runbook applies.
"""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import FLEX_EVICTIONS, Catalogue, num
from runtime.metrics.evictions import DISRUPTION_REASON, STATUS_REASON

SPLIT = (
    '{{ range $i, $s := printf "' + FLEX_EVICTIONS + '{namespace=%q} > 0" $labels.namespace '
    '| query | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $s.Labels.reason }} '
    "{{ $s.Value | humanize }}{{ end }}"
)
"""Go template: the non-zero per-reason rates of the alert's namespace, by reason name."""


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.flex_eviction_rate
    m = policy.metrics
    keep = f"; keeps firing {knobs.keep_firing_for} after it drops" if knobs.keep_firing_for else ""
    return [
        group(
            "gpupool.evictions",
            policy,
            [
                alert(
                    "FlexEvictionRateHigh",
                    f"sum by (namespace) ({FLEX_EVICTIONS}) > {num(knobs.per_minute_max)}",
                    knobs,
                    summary="Flex pods are evicted too often.",
                    description=(
                        "Flex pods in {{ $labels.namespace }} are evicted or preempted "
                        "{{ $value | humanize }} times per minute (limit "
                        f"{knobs.per_minute_max:g} per minute for {knobs.for_}{keep}). "
                        f"By reason: {SPLIT}. "
                        f"Counted once per pod: {STATUS_REASON} "
                        f"{'|'.join(m.eviction_reasons)} and {DISRUPTION_REASON} "
                        f"{'|'.join(m.disruption_reasons)}; Eviction-API disruptions (drains, "
                        "Karpenter) need kube-state-metrics >= 2.20. Mostly preemption: the "
                        "elastic thresholds are too aggressive; relax the reserve. "
                        "eviction-api: node consolidation or drains; kubelet: node pressure "
                        "(see the runbook)."
                    ),
                    tuner_trigger=True,
                    keep_firing_for=knobs.keep_firing_for,
                )
            ],
        )
    ]
