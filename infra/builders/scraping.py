"""How Prometheus finds the flex pods: one prometheus-operator PodMonitor.

The catalogue's per-instance vLLM queries group by ``policy.metrics.instance_labels``
(``namespace``, ``workload``, ``pod``). The operator sets ``namespace`` and ``pod`` on every
target; the relabeling copies the pod's ``app.kubernetes.io/instance`` (the workload name)
into ``policy.metrics.workload_label``. Pods without compaction have no sidecar port, and the
operator simply finds no target there.
"""

from __future__ import annotations

from infra.builders.compaction_sidecar import METRICS_PORT
from infra.builders.meta import PART_OF, Manifest, metadata
from infra.builders.workload import COMPONENT, HTTP_PORT
from policy import PoolPolicy

INSTANCE_META_LABEL = "__meta_kubernetes_pod_label_app_kubernetes_io_instance"
"""The pod's ``app.kubernetes.io/instance`` label, as Kubernetes service discovery names it."""


def flex_pod_monitor(policy: PoolPolicy) -> Manifest:
    """Scrape vLLM's and the compaction sidecar's ``/metrics`` on every flex pod."""
    meta = metadata("gpupool-flex", COMPONENT, namespace=policy.cluster.flex_namespace)
    meta["labels"] |= policy.metrics.rule_selector_labels
    relabel = {
        "sourceLabels": [INSTANCE_META_LABEL],
        "targetLabel": policy.metrics.workload_label,
        "action": "replace",
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/part-of": PART_OF,
                    "app.kubernetes.io/component": COMPONENT,
                }
            },
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": policy.metrics.evaluation_interval,
                    "relabelings": [relabel],
                }
                for port in (HTTP_PORT, METRICS_PORT)
            ],
        },
    }
