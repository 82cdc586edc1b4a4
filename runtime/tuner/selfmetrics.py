"""The tuner's own metrics (prometheus_client), on an explicit registry served at /metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class TunerMetrics:
    """Counters and timings of tuning cycles; tests pass a fresh registry."""

    registry: CollectorRegistry
    cycles: Counter
    proposals: Counter
    fail_closed: Counter
    compaction_requests: Counter
    notifications: Counter
    webhook_rejected: Counter
    query_seconds: Histogram
    last_cycle: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> TunerMetrics:
        r = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=r,
            cycles=Counter(
                "gpupool_tuner_cycles", "Tuning cycles run, by trigger.", ["trigger"], registry=r
            ),
            proposals=Counter(
                "gpupool_tuner_proposals",
                "Policy proposals, by rule and outcome (created, existing, dry_run).",
                ["rule", "outcome"],
                registry=r,
            ),
            fail_closed=Counter(
                "gpupool_tuner_fail_closed_skips",
                "Decisions skipped because their data was unusable, by rule and kind "
                "(unreachable, absent, stale, nan; fetch: the policy branch could not be fetched).",
                ["rule", "kind"],
                registry=r,
            ),
            compaction_requests=Counter(
                "gpupool_tuner_compaction_requests",
                "Compaction requests, by outcome (delivered, partial, failed, logged, dry_run).",
                ["outcome"],
                registry=r,
            ),
            notifications=Counter(
                "gpupool_tuner_notifications",
                "Accepted Alertmanager notifications, by outcome (triggered, duplicate, "
                "resolved); refused ones are in gpupool_tuner_webhook_rejected_total.",
                ["outcome"],
                registry=r,
            ),
            webhook_rejected=Counter(
                "gpupool_tuner_webhook_rejected",
                "Requests the webhook refused or dropped, by reason (unauthorized, "
                "length_required, bad_length, too_large, truncated, too_deep, malformed, "
                "invalid, protocol, timeout, busy).",
                ["reason"],
                registry=r,
            ),
            query_seconds=Histogram(
                "gpupool_tuner_query_seconds",
                "Latency of one Prometheus query.",
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                registry=r,
            ),
            last_cycle=Gauge(
                "gpupool_tuner_last_cycle_timestamp_seconds",
                "Wall-clock time the last cycle finished.",
                registry=r,
            ),
        )
