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
    """Fires above this many flex pod evictions per minute (brief: 5)."""


class KvHitRate(AlertRule):
    """KV prefix-cache hit rate of flex instances."""

    min: Fraction = Field(0.80, gt=0)
    """Fires below this hit rate (brief: 80 %): compact or add KV capacity."""


class GpuMemoryPressure(AlertRule):
    """GPU framebuffer use on any GPU."""

    max: Fraction = Field(0.95, gt=0)
    """Fires above this share of GPU memory in use."""


class ClusterUtilizationLow(AlertRule):
    """Cluster GPU utilization stays below the scale-up threshold but flex does not grow."""


class ProdCapacityAtRisk(AlertRule):
    """Production pods pending while flex pods hold GPUs."""


class MetricsStale(AlertRule):
    """A metric source that alerts, the HPA and the tuner depend on is absent or stale."""


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
    """ClusterGPUUtilizationLow: flex should be growing but is not."""
    prod_capacity_at_risk: ProdCapacityAtRisk = ProdCapacityAtRisk(for_="2m", severity="critical")
    """ProdCapacityAtRisk: production pods pending while flex pods run."""
    metrics_stale: MetricsStale = MetricsStale(for_="10m", severity="warning")
    """GpupoolMetricsStale: decisions would be made on missing data (they fail closed)."""


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
