"""All rule groups of a policy, by concern, with the cross-cutting pass applied once."""

from __future__ import annotations

from collections.abc import Callable

from alerts import (
    capacity,
    evictions,
    gpu,
    kv_cache,
    kv_snapshots,
    prerequisites,
    recording,
    serving,
    staleness,
)
from alerts.rules import Group, with_runbooks_and_labels
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue, build_catalogue

Concern = Callable[[PoolPolicy, Catalogue], list[Group]]

CONCERNS: dict[str, Concern] = {
    "budget": recording.budget_groups,
    "catalogue": recording.groups,
    "gpu": gpu.groups,
    "kv_cache": kv_cache.groups,
    "kv_snapshots": kv_snapshots.groups,
    "evictions": evictions.groups,
    "capacity": capacity.groups,
    "staleness": staleness.groups,
    "prerequisites": prerequisites.groups,
    "serving": serving.groups,
}
"""Rule file stem -> the module that builds its groups (one file per concern)."""


def rule_files(policy: PoolPolicy) -> dict[str, list[Group]]:
    """``{file stem: groups}`` for every concern, runbook links and cluster label included."""
    catalogue = build_catalogue(policy)
    return {
        stem: with_runbooks_and_labels(build(policy, catalogue), policy)
        for stem, build in CONCERNS.items()
    }


def all_groups(policy: PoolPolicy) -> list[Group]:
    """Every group in one list, as the PrometheusRule carries them."""
    return [g for groups in rule_files(policy).values() for g in groups]


def alert_names(policy: PoolPolicy) -> list[str]:
    """Distinct alert names, in rule order."""
    names = [r["alert"] for g in all_groups(policy) for r in g["rules"] if "alert" in r]
    return list(dict.fromkeys(names))
