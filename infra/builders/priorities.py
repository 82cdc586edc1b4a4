"""The three PriorityClasses: production > training > default (0) > idle-time inference."""

from __future__ import annotations

from infra.builders.meta import Manifest, metadata
from policy import PoolPolicy


def priority_classes(policy: PoolPolicy) -> list[Manifest]:
    """One PriorityClass per tier; none is the global default (unlabelled pods keep 0)."""
    tiers = policy.priorities
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": metadata(tier.name, "scheduling"),
            "value": tier.value,
            "preemptionPolicy": tier.preemption_policy,
            "globalDefault": False,
            "description": tier.description,
        }
        for tier in (tiers.production, tiers.training, tiers.idle_inference)
    ]
