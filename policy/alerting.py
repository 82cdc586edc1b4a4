"""Alert thresholds, their ``for:`` durations and severities, and Alertmanager routing."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from policy.base import (
    DnsLabel,
    Duration,
    Fraction,
    HttpUrlText,
    Invariants,
    StrictModel,
    duration_seconds,
)
from policy.receivers import Receiver, WebhookReceiver

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
    """Fires above this many flex pod disruptions per minute, summed over reasons (default: 5)."""
    keep_firing_for: Duration | None = "5m"
    """Prometheus ``keep_firing_for:`` (Prometheus >= 2.42): once firing, the alert stays
    firing this long after the rate drops to the limit, so a rate hovering around the limit
    does not resolve and re-notify (nor restart the tuner) every few minutes. The default
    equals the default ``for:``; ``null`` leaves it out (older Prometheus rejects the key)."""


class KvHitRate(AlertRule):
    """KV prefix-cache hit rate of flex instances."""

    min: Fraction = Field(0.80, gt=0)
    """Fires below this hit rate (default: 80 %): compact or add KV capacity."""
    min_queried_tokens_per_s: float = Field(10.0, ge=0)
    """Below this many prefix-cache queried tokens per second (``vllm:prefix_cache_queries_total``
    counts prompt TOKENS, not requests) over ``metrics.rate_window``, an instance's hit rate is
    not recorded, so it never fires: a few requests say nothing about the cache. The default,
    10 tokens/s, is 3,000 tokens in a 5-minute window, a handful of typical prompts; 0 keeps
    every instance that had any query."""
    warmup: Duration = "10m"
    """An instance whose vLLM API server process started less than this long ago never
    fires: a new or restarted replica begins with an empty prefix cache (and one that has
    restored nothing from the snapshot tier yet stays cold), so its first minutes say nothing
    about fragmentation or KV capacity. Counted from ``process_start_time_seconds`` of the
    scrape target serving the instance's ``vllm:`` series, which includes the model load, so
    the alert fires at the earliest ``warmup`` + ``for`` after the process started. Where that
    series is missing (vLLM with several API server processes exports none), nothing is
    suppressed: the alert behaves as without a warm-up."""


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


class KvTierThrashing(AlertRule):
    """The snapshot tier's capacity passes delete blocks that were still in use: the tier is
    smaller than the working set (``snapshot_volume.tier_capacity`` or the PVC too small)."""

    quantile: Fraction = Field(0.5, gt=0, lt=1)
    """Quantile of ``gpupool_kv_tier_evicted_age_seconds`` (time since last use of each block
    a capacity pass deleted) compared with ``evicted_age_below``. 0.5, the median: more than
    half of what the GC had to delete had been used within ``evicted_age_below``."""
    evicted_age_below: Duration = "15m"
    """Fires while that quantile, over ``metrics.rate_window`` (or three
    ``kv_cache.snapshot_gc_interval`` if longer, so every window holds passes), stays below
    this. The GC deletes least recently used first, so the tier then holds less than that
    much history: a replica evicted and rescheduled later than that restores nothing of its
    prefixes. The default is a bucket bound of the histogram (1m, 5m, 15m, 1h, 4h, 24h),
    where the comparison is exact: more than ``quantile`` of the deleted blocks were at most
    this old; between bounds the quantile is interpolated linearly within its bucket."""


class KvSnapshotGcStalled(AlertRule):
    """A flex pod's snapshot GC has not completed a pass for several GC intervals, or its
    sidecar stopped answering: nothing bounds the tier, so the volume fills and vLLM's
    writes fail."""

    missed_passes: int = Field(5, ge=2, le=1000)
    """Fires once the last completed pass is older than this many
    ``kv_cache.snapshot_gc_interval`` (default 5 x 1m). A pass is stamped with its start and
    the next one starts an interval after it ends, so a healthy pass that takes ``d`` seconds
    ages the stamp to ``2d`` + interval: a GC whose passes take longer than about twice the
    interval fires too (it cannot keep up with the volume)."""
    lookback: Duration = "6h"
    """How far back the last pass is looked up while the sidecar's scrape fails (``up`` 0):
    its series then vanish, and this keeps the alert firing for that long after the last
    answer. A sidecar that never answered a scrape is invisible here (the pod's container
    status, e.g. kube-prometheus' KubePodCrashLooping, covers it)."""


class KvSnapshotGcErrors(AlertRule):
    """A flex pod's snapshot GC fails to delete files (``gpupool_kv_tier_gc_errors_total``
    rising): what it cannot delete it cannot free."""


class KvSnapshotFlushDropped(AlertRule):
    """Grace-period flushes of stopping replicas dropped writes: ``disruption.snapshot_s`` is
    too short for the volume's write rate."""

    max_dropped_share: Fraction = 0.1
    """Fires above this share of the blocks in flight at the stop of the workload's exited
    replicas (written + failed + dropped) that were dropped when the budget ran out, over
    ``window``; 0 fires on any dropped block."""
    window: Duration = "1h"
    """Window of the share: replicas exit rarely (a rollout, an eviction), so it spans a
    rolling update's exits and keeps one exit's drops visible for that long."""


class ServingShed(AlertRule):
    """The endpoint picker refuses a large share of a pool's requests as saturated (HTTP 429:
    sheddable requests while every member is over its thresholds, docs/serving.md)."""

    max_share: Fraction = Field(0.25, gt=0)
    """Fires above this share of a pool's requests (refused + admitted) refused as saturated
    (``error_code="ResourceExhausted"``) over ``metrics.rate_window``. Shedding is the
    design under production pressure; a sustained quarter of the batch traffic refused means
    the flex pool is too small for it (or its thresholds too tight)."""
    min_requests_per_minute: float = Field(6.0, ge=0)
    """Below this many requests per minute (refused + admitted) a pool's share is not
    evaluated: a handful of requests says nothing about capacity."""


class ServingMetricsStale(AlertRule):
    """The endpoint picker routes on stale engine metrics: its own polls of the pool members'
    ``/metrics`` fail (llm-d-router's data-layer counter), or a Ready flex pod's ``/metrics``
    does not answer Prometheus either (the same endpoint the picker polls)."""


class ServingTerminatingRequests(AlertRule):
    """Requests reach a flex pod that is being deleted after vLLM stopped taking them: vLLM
    answers them with an empty 200 (finish reason ``abort``), so routing lags the drain."""

    window: Duration = "10m"
    """How long such a request keeps the condition true: a terminating pod lives for at most
    ``disruption.termination_grace_s``, shorter than a useful ``for:``, so the alert looks
    back over ``window`` (which must exceed ``for:``) and fires ``for:`` after the request."""

    @model_validator(mode="after")
    def _window_covers_for(self) -> ServingTerminatingRequests:
        found = Invariants()
        found.require(
            duration_seconds(self.window) > duration_seconds(self.for_),
            "window",
            f"window ({self.window}) must exceed for ({self.for_}): the condition holds for "
            "window after a request reached a terminating pod, so a shorter window never "
            "fires",
        )
        found.raise_if_any()
        return self


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
    kv_tier_thrashing: KvTierThrashing = KvTierThrashing(for_="30m", severity="warning")
    """KVSnapshotTierThrashing: capacity passes delete recently used blocks (series of the
    snapshot GC: only with ``kv_cache.kv_preservation: filesystem``)."""
    kv_snapshot_gc_stalled: KvSnapshotGcStalled = KvSnapshotGcStalled(for_="5m", severity="warning")
    """KVSnapshotGCStalled: a pod's snapshot GC stopped passing or answering."""
    kv_snapshot_gc_errors: KvSnapshotGcErrors = KvSnapshotGcErrors(for_="15m", severity="warning")
    """KVSnapshotGCErrors: a pod's snapshot GC keeps failing to delete files."""
    kv_snapshot_flush_dropped: KvSnapshotFlushDropped = KvSnapshotFlushDropped(
        for_="5m", severity="warning"
    )
    """KVSnapshotFlushDropped: stopping replicas drop the writes their flush had no time for."""
    serving_shed: ServingShed = ServingShed(for_="15m", severity="warning")
    """ServingRequestsShed: a pool's picker refuses too many requests as saturated (only with
    a ``serving`` section; reads the picker's own series)."""
    serving_metrics_stale: ServingMetricsStale = ServingMetricsStale(for_="5m", severity="warning")
    """ServingEndpointMetricsStale: the picker polls pool members' metrics in vain."""
    serving_terminating_requests: ServingTerminatingRequests = ServingTerminatingRequests(
        for_="1m", severity="warning"
    )
    """ServingRequestsToTerminatingPod: routing sent requests to a draining flex pod."""


def _check_group_by(value: str) -> str:
    """An Alertmanager ``group_by`` entry: a label name (``model.LabelName``) or ``...``."""
    if value != "..." and re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value, re.ASCII) is None:
        raise ValueError(
            "expected a label name (ASCII letters, digits and '_', not starting with a digit) "
            f"or '...', e.g. alertname, found {value!r}"
        )
    return value


GroupByLabel = Annotated[str, AfterValidator(_check_group_by)]
"""One ``group_by`` label of an Alertmanager route."""


class Routing(StrictModel):
    """Alertmanager routing: severity decides the receiver; the tuner hears its triggers."""

    receivers: list[Receiver] = Field(min_length=1)
    """Every receiver routes may name; cluster-specific, so pool.yaml must list them."""
    by_severity: dict[Severity, DnsLabel]
    """Receiver for each severity; a missing severity goes to ``default_receiver``."""
    default_receiver: DnsLabel
    """Receiver for anything no other route matches."""
    tuner_receiver: DnsLabel | None = None
    """Receiver of the tuner's webhook; it also gets the alerts that trigger a tuning cycle.
    A ``webhook`` receiver without ``authorization``: it sends the tuner's own token
    (``tuner.webhook_token_secret``)."""
    group_by: list[GroupByLabel] = Field(default_factory=lambda: ["alertname", "namespace"])
    """Labels that group alerts into one notification (Prometheus label names, or ``...``
    alone: group by every label)."""
    group_wait: Duration = "30s"
    """Alertmanager ``group_wait``: delay before the first notification of a group."""
    group_interval: Duration = "5m"
    """Alertmanager ``group_interval``: delay before notifying about new alerts in a group."""
    repeat_interval: Duration = "4h"
    """Alertmanager ``repeat_interval``: re-send a still-firing notification after this."""

    @model_validator(mode="after")
    def _known_receivers(self) -> Routing:
        found = Invariants()
        found.require(
            len({r.name for r in self.receivers}) == len(self.receivers),
            "receivers",
            "receiver names must be unique",
        )
        self._check_grouping(found)
        self._check_routes_known(found)
        self._check_tuner_receiver(found)
        found.raise_if_any()
        return self

    def _check_grouping(self, found: Invariants) -> None:
        """``group_by`` as Alertmanager accepts it: ``...`` alone, no label twice."""
        found.require(
            "..." not in self.group_by or self.group_by == ["..."],
            "group_by",
            f"'...' (group by every label) stands alone in Alertmanager, found {self.group_by}; "
            "expected ['...'] or label names, e.g. [alertname, namespace]",
        )
        found.require(
            len(set(self.group_by)) == len(self.group_by),
            "group_by",
            f"group_by lists a label twice: {self.group_by} (Alertmanager refuses it)",
        )

    def _check_routes_known(self, found: Invariants) -> None:
        """Every receiver a route names is one of ``receivers``."""
        known = {r.name for r in self.receivers}
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

    def _check_tuner_receiver(self, found: Invariants) -> None:
        """The tuner's receiver sends the tuner's own token, so it is a plain webhook."""
        known = {r.name for r in self.receivers}
        found.require(
            self.tuner_receiver is None
            or self.tuner_webhook() is not None
            or self.tuner_receiver not in known,
            "tuner_receiver",
            f"receiver {self.tuner_receiver!r} must be type: webhook without authorization "
            "(the tuner's own token, tuner.webhook_token_secret, is sent)",
        )

    def tuner_webhook(self) -> WebhookReceiver | None:
        """The tuner's receiver when it is a webhook without its own authorization."""
        for r in self.receivers:
            if (
                r.name == self.tuner_receiver
                and isinstance(r, WebhookReceiver)
                and r.authorization is None
            ):
                return r
        return None


class Alerting(StrictModel):
    """Thresholds and routing."""

    thresholds: AlertThresholds = AlertThresholds()
    """Per-alert thresholds, ``for:`` durations and severities."""
    routing: Routing
    """Alertmanager routes and receivers (cluster-specific: set them in pool.yaml)."""
    runbook_base_url: HttpUrlText = "https://github.com/gpupool/gpupool/blob/main/docs/runbooks.md"
    """Base of every alert's ``runbook_url``; the alert's anchor is appended."""
