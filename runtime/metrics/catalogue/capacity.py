"""Capacity beside the budget: what production demands and waits for, flex's pods and HPAs
(kube-state-metrics)."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import (
    BUDGET_LABEL,
    FLEX_HPA_AT_MAX,
    FLEX_PODS_RUNNING,
    PROD_PODS_PENDING,
    PRODUCTION_GPUS_DEMANDED,
)
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Query


class _CapacityQueries(Selectors):
    """The capacity queries and the fragments only they read."""

    def production_demanded(self) -> str:
        """GPUs production asks for: held by its bound pods plus requested by its pending
        ones (0 with neither, while kube-state-metrics reports pods)."""
        pending = self.pending_gpus(self.production_pods())
        return (
            f"(({self.production_held()} or vector(0)) + {pending}) and on () count(kube_pod_info)"
        )

    def prod_unschedulable(self) -> str:
        """Production pods requesting GPUs the scheduler cannot place (``PodScheduled=False``,
        reason ``Unschedulable``; kube-state-metrics exports the series only while that holds),
        counted; ``0 * count(kube_pod_info)`` records 0, not nothing, while kube-state-metrics
        is up, so the tuner can tell "none waiting" from "no data"."""
        unschedulable = "(max by (namespace, pod) (kube_pod_status_unschedulable) == 1)"
        wants_gpus = f"(sum by (namespace, pod) ({self.gpu_requests()}) > 0)"
        return (
            f"(count({unschedulable} and on (namespace, pod) {wants_gpus}"
            f" and on (namespace, pod) {self.production_pods()})"
            " or (0 * count(kube_pod_info)))"
        )

    def queries(self) -> list[Query]:
        """Capacity beside the budget: what production demands and waits for, flex's pods
        and HPAs (kube-state-metrics)."""
        ns = self.flex_ns
        production = ("priorities.production", "metrics.gpu_resource")
        return [
            Query(
                PRODUCTION_GPUS_DEMANDED,
                self.production_demanded(),
                "GPUs production's pods hold or wait for (bound plus pending requests): the "
                "gpus_demanded of a production trace (gpupool production-trace).",
                "gpus",
                production,
            ),
            Query(
                PROD_PODS_PENDING,
                self.prod_unschedulable(),
                "Pods of the production PriorityClass that request GPUs and that the scheduler "
                "cannot place (kube_pod_status_unschedulable); 0 when none, absent without "
                "kube-state-metrics. Pending pods already bound to a node (pulling images, "
                "running init containers) do not count.",
                "pods",
                production,
            ),
            Query(
                FLEX_PODS_RUNNING,
                f'sum(kube_pod_status_phase{{namespace="{ns}", phase="Running"}})',
                "Running pods in the flex namespace.",
                "pods",
                ("cluster.flex_namespace",),
            ),
            Query(
                FLEX_HPA_AT_MAX,
                "label_replace(max by (namespace, horizontalpodautoscaler) "
                f'(kube_horizontalpodautoscaler_status_current_replicas{{namespace="{ns}"}})'
                " >= bool on (namespace, horizontalpodautoscaler) "
                "max by (namespace, horizontalpodautoscaler) "
                f'(kube_horizontalpodautoscaler_spec_max_replicas{{namespace="{ns}"}}), '
                f'"{BUDGET_LABEL}", "$1", "horizontalpodautoscaler", "(.*)")',
                "1 where a flex workload's HPA runs its maxReplicas (kube-state-metrics), else 0; "
                "the tuner widens max_replicas only there.",
                "bool",
                ("cluster.flex_namespace",),
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The capacity queries, each with the policy fields it reads."""
    return _CapacityQueries(policy).queries()
