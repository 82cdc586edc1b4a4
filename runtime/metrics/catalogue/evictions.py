"""Flex evictions, counted by ``runtime.metrics.evictions``."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import FLEX_EVICTIONS
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Query
from runtime.metrics.evictions import flex_evictions_expr


class _EvictionQueries(Selectors):
    """The eviction query."""

    def evictions(self) -> str:
        """Flex pods first seen disrupted within the window, per minute, by canonical reason."""
        return flex_evictions_expr(self.policy)

    def queries(self) -> list[Query]:
        """Flex evictions (runtime.metrics.evictions)."""
        return [
            Query(
                FLEX_EVICTIONS,
                self.evictions(),
                "Flex pods disrupted per minute by reason (preemption, eviction-api, kubelet, "
                "node, other), each pod once: kube_pod_status_reason and (KSM >= 2.20) "
                "kube_pod_status_disruption_reason.",
                "per_minute",
                (
                    "cluster.flex_namespace",
                    "metrics.rate_window",
                    "metrics.eviction_reasons",
                    "metrics.disruption_reasons",
                ),
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The eviction query, with the policy fields it reads."""
    return _EvictionQueries(policy).queries()
