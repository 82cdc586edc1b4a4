"""PromQL fragments several concerns of the catalogue share, built from the policy."""

from __future__ import annotations

import re

from policy.nodepools import NodePool
from policy.pool import PoolPolicy

BOUND = 'node!=""'
UNBOUND = 'node=""'
"""kube-state-metrics' ``node`` label of a pod's requests: empty until the pod is bound."""


def ksm_label(kubernetes_label: str) -> str:
    """KSM name of a label (``gpupool.io/pool`` -> ``label_gpupool_io_pool``)."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", kubernetes_label)


def num(value: float) -> str:
    """A PromQL number literal that round-trips the policy's float."""
    return repr(float(value))


class Selectors:
    """The policy's selectors and joins; one method per fragment several concerns share.

    Each concern's builder extends it with the fragments only that concern reads."""

    def __init__(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.m = policy.metrics
        self.flex_ns = policy.cluster.flex_namespace
        self.window = self.m.rate_window
        self.by_instance = ", ".join(self.m.instance_labels)

    def vllm(self, name: str, matchers: str = "") -> str:
        """Selector of a vLLM metric (``name`` without prefix) of the flex instances,
        narrowed by ``matchers``."""
        extra = f", {matchers}" if matchers else ""
        return f'vllm:{name}{{namespace="{self.flex_ns}"{extra}}}'

    def node_pool(self, pools: list[NodePool]) -> str:
        """``node`` -> ``pool`` of every node labelled with one of ``pools``."""
        ksm = ksm_label(self.policy.cluster.pool_label)
        names = "|".join(p.name for p in pools)
        return (
            f'max by (node, pool) (label_replace(kube_node_labels{{{ksm}=~"{names}"}}, '
            f'"pool", "$1", "{ksm}", "(.*)"))'
        )

    def live_pods(self, phase: str = "Pending|Running", namespace: str | None = None) -> str:
        """1 per non-terminated pod (``phase`` a regex); the filter every GPU request joins."""
        ns = f'namespace="{namespace}", ' if namespace else ""
        return f'max by (namespace, pod) (kube_pod_status_phase{{{ns}phase=~"{phase}"}} == 1)'

    def production_pods(self) -> str:
        """1 per pod of the production PriorityClass."""
        name = self.policy.priorities.production.name
        return f'max by (namespace, pod) (kube_pod_info{{priority_class="{name}"}})'

    def gpu_requests(self, matchers: str = "") -> str:
        """GPUs each container requests (kube-state-metrics), narrowed by ``matchers``."""
        extra = f", {matchers}" if matchers else ""
        return f'kube_pod_container_resource_requests{{resource="{self.m.gpu_resource}"{extra}}}'

    def pending_gpus(self, pods: str) -> str:
        """GPUs requested by unbound Pending pods selected by ``pods`` (a 1-per-pod vector)."""
        return (
            f"(sum({self.gpu_requests(UNBOUND)}"
            f" * on (namespace, pod) group_left () {self.live_pods('Pending')}"
            f" * on (namespace, pod) group_left () {pods}) or vector(0))"
        )

    def production_held(self) -> str:
        """GPUs requested by production's bound, non-terminated pods (no labels; absent when
        it holds none)."""
        return (
            f"sum({self.gpu_requests(BOUND)}"
            f" * on (namespace, pod) group_left () {self.live_pods()}"
            f" * on (namespace, pod) group_left () {self.production_pods()})"
        )
