"""Who may reach gpupool's pods: the peers of the NetworkPolicies (infra/builders/network.py).

Every port gpupool opens is closed to everything but the client that needs it: the vLLM port
to the flex namespace itself, the namespaces named here and Prometheus; the compaction
sidecar's port to the tuner and Prometheus; the tuner's webhook to Alertmanager and
Prometheus. The defaults match kube-prometheus-stack (prometheus-operator labels its pods
``app.kubernetes.io/name: prometheus`` / ``alertmanager``).
"""

from __future__ import annotations

from pydantic import Field

from policy.base import DnsLabel, LabelKey, LabelValue, StrictModel


class Network(StrictModel):
    """NetworkPolicy peers: the monitoring stack and the clients of the flex vLLM servers."""

    monitoring_namespace: DnsLabel = "monitoring"
    """Namespace of the Prometheus that scrapes gpupool (the host of ``cluster.prometheus_url``)."""
    prometheus_pod_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}, min_length=1
    )
    """Labels of the Prometheus pods that scrape the flex pods and the tuner."""
    alertmanager_namespace: DnsLabel | None = None
    """Namespace of the cluster's Alertmanager (prometheus-operator): its pods post to the
    tuner, gpupool's ``AlertmanagerConfig`` is rendered there (so the operator adds its routes
    under ``alertmanagerConfigMatcherStrategy`` ``OnNamespaceExceptForAlertmanagerNamespace``
    or ``None``, docs/alerts.md) and the Secrets its receivers name must live there. Unset:
    ``monitoring_namespace`` (kube-prometheus-stack runs both in one namespace)."""
    alertmanager_pod_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "alertmanager"}, min_length=1
    )
    """Labels of the Alertmanager pods that post webhooks to the tuner."""

    @property
    def alertmanager_home(self) -> str:
        """``alertmanager_namespace``, or ``monitoring_namespace`` when unset."""
        return self.alertmanager_namespace or self.monitoring_namespace

    flex_client_namespaces: list[DnsLabel] = Field(default_factory=list)
    """Namespaces whose pods may send requests to the flex vLLM servers (your gateway or
    router), besides the flex namespace itself. Empty: only pods in the flex namespace."""
