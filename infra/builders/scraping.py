"""How Prometheus finds the flex pods (one prometheus-operator PodMonitor) and the serving
layer's endpoint pickers (one per pool, ``endpoint_picker_pod_monitor``).

The catalogue's per-instance vLLM queries group by ``policy.metrics.instance_labels``
(``namespace``, ``workload``, ``pod``). The operator sets ``namespace`` and ``pod`` on every
target; the relabeling copies the pod's ``app.kubernetes.io/instance`` (the workload name)
into ``policy.metrics.workload_label``. Pods without compaction have no sidecar port, and the
operator simply finds no target there.
"""

from __future__ import annotations

from infra.builders.compaction_sidecar import METRICS_PORT
from infra.builders.meta import PART_OF, Manifest, metadata
from infra.builders.vllm_container import HTTP_PORT
from infra.builders.workload import COMPONENT
from policy import PoolPolicy

INSTANCE_META_LABEL = "__meta_kubernetes_pod_label_app_kubernetes_io_instance"
"""The pod's ``app.kubernetes.io/instance`` label, as Kubernetes service discovery names it."""

POOL_TARGET_LABEL = "inference_pool"
"""Target label naming the InferencePool on every series of its endpoint picker: the
pickers' request and error counters carry model labels only, and one picker serves one pool.
The serving alerts (alerts/serving.py) group by it and read only series that have it."""


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


def endpoint_picker_pod_monitor(
    policy: PoolPolicy, pool: str, namespace: str, pod_selector: dict[str, str], port: str
) -> Manifest:
    """Scrape one pool's endpoint picker on its ``port`` (the NetworkPolicy admits Prometheus
    there), with ``POOL_TARGET_LABEL`` set to the pool's name."""
    meta = metadata(f"{pool}-epp", "serving", namespace=namespace, instance=f"{pool}-epp")
    meta["labels"] |= policy.metrics.rule_selector_labels
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": dict(pod_selector)},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": policy.metrics.evaluation_interval,
                    "relabelings": [
                        {"targetLabel": POOL_TARGET_LABEL, "replacement": pool, "action": "replace"}
                    ],
                }
            ],
        },
    }
