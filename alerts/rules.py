"""Building blocks every rules module shares: one alert rule, one group, the runbook pass.

A group is the plain dict Prometheus reads (``name``, ``interval``, ``rules``); rules modules
(``alerts/gpu.py``, ``alerts/kv_cache.py`` ...) return lists of them, and ``alerts/bundle.py``
collects them, adds the cross-cutting labels and ``runbook_url`` in one pass.
"""

from __future__ import annotations

from typing import Any

from policy.alerting import AlertRule
from policy.pool import PoolPolicy

Rule = dict[str, Any]
Group = dict[str, Any]

TUNER_LABEL = "gpupool_tuner"
"""Label marking alerts that start a tuning cycle; Alertmanager also routes them to the tuner."""


def alert(
    name: str,
    expr: str,
    knobs: AlertRule,
    *,
    summary: str,
    description: str,
    tuner_trigger: bool = False,
    keep_firing_for: str | None = None,
) -> Rule:
    """An alerting rule whose ``for:`` and ``severity`` come from the policy's ``knobs``.

    ``keep_firing_for`` (a Prometheus duration; Prometheus >= 2.42) keeps a firing alert
    firing that long after its condition clears; ``None`` leaves the key out.
    """
    labels: dict[str, str] = {"severity": knobs.severity}
    if tuner_trigger:
        labels[TUNER_LABEL] = "true"
    rule: Rule = {"alert": name, "expr": expr, "for": knobs.for_}
    if keep_firing_for is not None:
        rule["keep_firing_for"] = keep_firing_for
    return {
        **rule,
        "labels": labels,
        "annotations": {"summary": summary, "description": description},
    }


def group(name: str, policy: PoolPolicy, rules: list[Rule]) -> Group:
    """A rule group evaluated at the policy's cadence."""
    return {"name": name, "interval": policy.metrics.evaluation_interval, "rules": rules}


def runbook_anchor(alertname: str) -> str:
    """GitHub's anchor for the ``## <AlertName>`` heading of docs/runbooks.md."""
    return alertname.lower()


def with_runbooks_and_labels(groups: list[Group], policy: PoolPolicy) -> list[Group]:
    """Every alert gets ``runbook_url`` and the ``cluster`` label; recording rules are untouched."""
    base = policy.alerting.runbook_base_url
    out: list[Group] = []
    for g in groups:
        rules: list[Rule] = []
        for rule in g["rules"]:
            if "alert" in rule:
                url = f"{base}#{runbook_anchor(rule['alert'])}"
                rule = {
                    **rule,
                    "labels": {**rule["labels"], "cluster": policy.cluster.name},
                    "annotations": {**rule["annotations"], "runbook_url": url},
                }
            rules.append(rule)
        out.append({**g, "rules": rules})
    return out
