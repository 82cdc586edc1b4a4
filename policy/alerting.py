"""Alert thresholds, their ``for:`` durations and severities, and Alertmanager routing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, HttpUrl, model_validator

from policy.base import DnsLabel, Duration, Fraction, Invariants, StrictModel

Severity = Literal["critical", "warning", "info"]


class AlertRule(StrictModel):
    """Common knobs of one alert: how long the condition must hold, and how loud it is."""

    for_: Duration = Field(alias="for")
    """Prometheus ``for:``: the condition must hold this long before the alert fires."""
    severity: Severity
    """``severity`` label; routes the notification."""


class FlexEvictionRate(AlertRule):
    """Flex evictions/preemptions per minute: too many means the thresholds are too aggressive."""

    per_minute_max: float = Field(5.0, gt=0)
    """Fires above this many flex pod disruptions per minute, summed over reasons (brief: 5)."""
    keep_firing_for: Duration | None = "5m"
    """Prometheus ``keep_firing_for:`` (Prometheus >= 2.42): once firing, the alert stays
    firing this long after the rate drops to the limit, so a rate hovering around the limit
    does not resolve and re-notify (nor restart the tuner) every few minutes. The default
    equals the default ``for:``; ``null`` leaves it out (older Prometheus rejects the key)."""


class KvHitRate(AlertRule):
    """KV prefix-cache hit rate of flex instances."""

    min: Fraction = Field(0.80, gt=0)
    """Fires below this hit rate (brief: 80 %): compact or add KV capacity."""
    min_queried_tokens_per_s: float = Field(10.0, ge=0)
    """Below this many prefix-cache queried tokens per second (``vllm:prefix_cache_queries_total``
    counts prompt TOKENS, not requests) over ``metrics.rate_window``, an instance's hit rate is
    not recorded, so it never fires: a few requests say nothing about the cache. The default,
    10 tokens/s, is 3,000 tokens in a 5-minute window, a handful of typical prompts; 0 keeps
    every instance that had any query."""


class GpuMemoryPressure(AlertRule):
    """GPU framebuffer use on any GPU."""

    max: Fraction = Field(0.95, gt=0)
    """Fires above this share of GPU memory in use."""


class ClusterUtilizationLow(AlertRule):
    """FlexNotGrowing: the budget's grow condition holds (production below
    ``elastic.grow_while_production_below``), a flex pool has headroom for a replica, and the
    workload's HPA is below ``maxReplicas``, yet flex does not grow. The key keeps its old
    name (``cluster_utilization_low``) so existing policies load unchanged."""


class ProdCapacityAtRisk(AlertRule):
    """Production pods that request GPUs are unschedulable while flex pods run."""


class MetricsStale(AlertRule):
    """A metric source that alerts, the HPA and the tuner depend on is absent or stale."""


class MetricMissing(AlertRule):
    """An exporter is up but one of the series gpupool needs from it is missing (disabled)."""


class NodePoolLabelsMissing(AlertRule):
    """kube-state-metrics is up but no node carries the pool label gpupool joins on."""


class GpuExporterDown(AlertRule):
    """A dcgm-exporter scrape target (``metrics.dcgm_job``) is down."""


class GpusNotReporting(AlertRule):
    """A gpupool node reports fewer GPUs to dcgm-exporter than it has allocatable."""


class GpuPodAttributionMissing(AlertRule):
    """Production holds GPUs but dcgm-exporter attributes none of them to its pods."""


class AlertThresholds(StrictModel):
    """One entry per alert gpupool ships; thresholds and ``for:`` live here, not in rule bodies."""

    flex_eviction_rate: FlexEvictionRate = FlexEvictionRate(for_="5m", severity="warning")
    """FlexEvictionRateHigh: evictions above the limit mean the reserve should be relaxed."""
    kv_hit_rate: KvHitRate = KvHitRate(for_="15m", severity="warning")
    """KVCacheHitRateLow: compact or add KV capacity."""
    gpu_memory_pressure: GpuMemoryPressure = GpuMemoryPressure(for_="10m", severity="warning")
    """GPUMemoryPressure: a GPU's framebuffer is nearly full."""
    cluster_utilization_low: ClusterUtilizationLow = ClusterUtilizationLow(
        for_="30m", severity="info"
    )
    """FlexNotGrowing (was ClusterGPUUtilizationLow): flex should be growing but is not."""
    prod_capacity_at_risk: ProdCapacityAtRisk = ProdCapacityAtRisk(for_="2m", severity="critical")
    """ProdCapacityAtRisk: unschedulable GPU-requesting production pods while flex pods run."""
    metrics_stale: MetricsStale = MetricsStale(for_="10m", severity="warning")
    """GpupoolMetricsStale: decisions would be made on missing data (they fail closed)."""
    metric_missing: MetricMissing = MetricMissing(for_="15m", severity="warning")
    """GpupoolMetricMissing: an exporter runs without a series gpupool reads (a disabled
    kube-state-metrics resource, a ``metrics.dcgm_job`` that matches no scrape job)."""
    node_pool_labels_missing: NodePoolLabelsMissing = NodePoolLabelsMissing(
        for_="15m", severity="warning"
    )
    """NodePoolLabelsMissing: kube-state-metrics exports no node's pool label, so every
    per-pool query (headroom, budget, reserve) is empty."""
    gpu_exporter_down: GpuExporterDown = GpuExporterDown(for_="5m", severity="warning")
    """GPUExporterDown: one dcgm-exporter target does not answer its scrape."""
    gpus_not_reporting: GpusNotReporting = GpusNotReporting(for_="15m", severity="warning")
    """GPUsNotReporting: a node's GPUs are missing from dcgm-exporter (the default leaves a
    new node's exporter pod time to start)."""
    gpu_pod_attribution_missing: GpuPodAttributionMissing = GpuPodAttributionMissing(
        for_="30m", severity="warning"
    )
    """GPUPodAttributionMissing: dcgm-exporter runs without Kubernetes pod attribution."""


class Receiver(StrictModel):
    """An Alertmanager webhook receiver."""

    name: DnsLabel
    """Receiver name used in routes."""
    webhook_url: HttpUrl
    """Where Alertmanager POSTs notifications (payload version 4)."""


class Routing(StrictModel):
    """Alertmanager routing: severity decides the receiver; the tuner hears its triggers."""

    receivers: list[Receiver] = Field(min_length=1)
    """Every receiver routes may name; cluster-specific, so pool.yaml must list them."""
    by_severity: dict[Severity, DnsLabel]
    """Receiver for each severity; a missing severity goes to ``default_receiver``."""
    default_receiver: DnsLabel
    """Receiver for anything no other route matches."""
    tuner_receiver: DnsLabel | None = None
    """Receiver of the tuner's webhook; it also gets the alerts that trigger a tuning cycle."""
    group_by: list[str] = Field(default_factory=lambda: ["alertname", "namespace"])
    """Labels that group alerts into one notification."""
    group_wait: Duration = "30s"
    """Alertmanager ``group_wait``: delay before the first notification of a group."""
    group_interval: Duration = "5m"
    """Alertmanager ``group_interval``: delay before notifying about new alerts in a group."""
    repeat_interval: Duration = "4h"
    """Alertmanager ``repeat_interval``: re-send a still-firing notification after this."""

    @model_validator(mode="after")
    def _known_receivers(self) -> Routing:
        found = Invariants()
        known = {r.name for r in self.receivers}
        found.require(
            len(known) == len(self.receivers), "receivers", "receiver names must be unique"
        )
        for severity, name in self.by_severity.items():
            found.require(
                name in known,
                f"by_severity.{severity}",
                f"receiver {name!r} is not in receivers {sorted(known)}",
            )
        for field in ("default_receiver", "tuner_receiver"):
            name = getattr(self, field)
            found.require(
                name is None or name in known,
                field,
                f"receiver {name!r} is not in receivers {sorted(known)}",
            )
        found.raise_if_any()
        return self


class Alerting(StrictModel):
    """Thresholds and routing."""

    thresholds: AlertThresholds = AlertThresholds()
    """Per-alert thresholds, ``for:`` durations and severities."""
    routing: Routing
    """Alertmanager routes and receivers (cluster-specific: set them in pool.yaml)."""
    runbook_base_url: str = "https://github.com/gpupool/gpupool/blob/main/docs/runbooks.md"
    """Base of every alert's ``runbook_url``; the alert's anchor is appended."""
