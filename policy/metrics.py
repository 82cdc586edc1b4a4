"""Where gpupool's metrics come from: label names, query windows and evaluation cadence.

These values depend on how the cluster's exporters are deployed (dcgm-exporter's node label,
how the flex vLLM pods are scraped); the metrics catalogue reads them instead of literals.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from policy.base import Duration, Invariants, StrictModel, duration_seconds


class MetricSources(StrictModel):
    """Label names and windows of the series the catalogue queries."""

    gpu_node_label: str = Field("Hostname", min_length=1)
    """dcgm-exporter label holding the node name (``Hostname``; ``hostname`` in its newest
    releases); joins each GPU to its node pool through kube-state-metrics' ``kube_node_labels``."""
    workload_label: str = Field("workload", min_length=1)
    """Target label naming the flex workload on scraped vLLM series (set by the scrape config,
    e.g. a PodMonitor relabeling the pod's ``app.kubernetes.io/name``)."""
    instance_labels: list[str] = Field(
        default_factory=lambda: ["namespace", "workload", "pod"], min_length=1
    )
    """Labels that identify one vLLM instance; per-instance series (KV usage, hit rate,
    preemptions) are aggregated by these, so several engines of one pod count as one."""
    rate_window: Duration = "5m"
    """Window of every ``rate()`` in the catalogue (hit rate, preemptions, evictions); at least
    four scrape intervals so a missed scrape does not blank the series."""
    evaluation_interval: Duration = "30s"
    """How often Prometheus evaluates gpupool's recording and alerting rules."""
    eviction_reasons: list[str] = Field(
        default_factory=lambda: ["Evicted", "PreemptionByScheduler"], min_length=1
    )
    """``reason`` values of kube-state-metrics' ``kube_pod_status_reason`` that count as a
    flex eviction (kubelet/API eviction and scheduler preemption)."""
    alertmanager_secret: str = Field("alertmanager-main", min_length=1)
    """Secret the Prometheus operator reads the Alertmanager configuration from
    (``alertmanager-<Alertmanager name>``, key ``alertmanager.yaml``)."""
    rule_selector_labels: dict[str, str] = Field(default_factory=dict)
    """Labels put on the PrometheusRule and dashboard so the operator's ``ruleSelector`` picks
    them up (kube-prometheus-stack: ``release: <helm release>``)."""

    @model_validator(mode="after")
    def _windows(self) -> MetricSources:
        found = Invariants()
        found.require(
            duration_seconds(self.rate_window) >= 2 * duration_seconds(self.evaluation_interval),
            "rate_window",
            f"rate_window ({self.rate_window}) must be at least twice evaluation_interval "
            f"({self.evaluation_interval}); rate() needs two samples in the window",
        )
        found.raise_if_any()
        return self
