"""Synthetic recorded series for the tuner's scenarios, written as OpenMetrics and
backfilled with ``promtool tsdb create-blocks-from openmetrics``.

Each scenario occupies its own stretch of time (gaps longer than the tuner's window), so
one Prometheus holds them all and a cycle evaluated at a scenario's end sees only it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from runtime.metrics import catalogue
from runtime.tuner import signals

T0 = 1_767_225_600
"""2026-01-01T00:00:00Z: the first scenario starts here."""
STEP_S = 30
"""Recording-rule evaluation interval of the synthetic data."""
SPAN_S = 40 * 60
"""Each scenario's history: longer than the tuner's default 30m window."""
SLOT_S = 3 * 3600
"""Start-to-start distance of scenarios."""

QUIET: dict[str, float] = {
    catalogue.CLUSTER_GPU_UTILIZATION: 0.50,
    catalogue.FLEX_EVICTIONS: 0.5,
    catalogue.PROD_PODS_PENDING: 0,
    catalogue.VLLM_QUEUE_DEPTH: 0,
    catalogue.FLEX_HEADROOM_GPUS: 4,
    catalogue.KV_CACHE_USAGE: 0.60,
    catalogue.KV_CACHE_HIT_RATE: 0.92,
}
"""A healthy cluster: every rule is a no-op."""


@dataclass(frozen=True)
class Scenario:
    name: str
    values: dict[str, float] = field(default_factory=dict)
    """Overrides of QUIET for the whole span."""
    ends_before_s: int = 0
    """Data stops this long before the evaluation time (stale metrics)."""
    second_workload_hit_rate: float | None = None
    """A second, healthy label set of the hit-rate series (the worst one must decide)."""


SCENARIOS = [
    Scenario("quiet"),
    Scenario("storm", {catalogue.FLEX_EVICTIONS: 12, catalogue.PROD_PODS_PENDING: 2}),
    Scenario("idle", {catalogue.CLUSTER_GPU_UTILIZATION: 0.20, catalogue.VLLM_QUEUE_DEPTH: 30}),
    Scenario(
        "kv_full",
        {catalogue.KV_CACHE_HIT_RATE: 0.60, catalogue.KV_CACHE_USAGE: 0.92},
        second_workload_hit_rate=0.95,
    ),
    Scenario("kv_sparse", {catalogue.KV_CACHE_HIT_RATE: 0.60, catalogue.KV_CACHE_USAGE: 0.30}),
    Scenario(
        "stale",
        {catalogue.CLUSTER_GPU_UTILIZATION: 0.20, catalogue.VLLM_QUEUE_DEPTH: 30},
        ends_before_s=600,
    ),
    Scenario(
        "nan", {catalogue.CLUSTER_GPU_UTILIZATION: 0.20, catalogue.VLLM_QUEUE_DEPTH: math.nan}
    ),
]


PER_WORKLOAD = {
    name: ',workload="llama-8b-flex"'
    for name in (catalogue.VLLM_QUEUE_DEPTH, catalogue.KV_CACHE_USAGE, catalogue.KV_CACHE_HIT_RATE)
}
"""Series the catalogue records per workload; the rest are cluster- or pool-wide."""


def evaluation_time(name: str) -> float:
    """When a cycle should look at scenario ``name``: the end of its span."""
    index = next(i for i, s in enumerate(SCENARIOS) if s.name == name)
    return float(T0 + index * SLOT_S + SPAN_S)


def _series(scenario: Scenario, index: int) -> Iterator[tuple[str, str, int, float]]:
    start = T0 + index * SLOT_S
    end = start + SPAN_S - scenario.ends_before_s
    for name in signals.SIGNALS:
        value = scenario.values.get(name, QUIET[name])
        labels = f'cluster="demo-cluster"{PER_WORKLOAD.get(name, "")}'
        for t in range(start, end + 1, STEP_S):
            yield name, labels, t, value
        if name == catalogue.KV_CACHE_HIT_RATE and scenario.second_workload_hit_rate is not None:
            for t in range(start, end + 1, STEP_S):
                yield (
                    name,
                    'cluster="demo-cluster",workload="other"',
                    t,
                    (scenario.second_workload_hit_rate),
                )


def openmetrics() -> str:
    """All scenarios as one OpenMetrics text: families contiguous, samples in time order."""
    by_family: dict[str, list[str]] = {name: [] for name in signals.SIGNALS}
    for index, scenario in enumerate(SCENARIOS):
        for name, labels, t, value in _series(scenario, index):
            text = "NaN" if math.isnan(value) else repr(float(value))
            by_family[name].append(f"{name}{{{labels}}} {text} {t}")
    lines = []
    for name, samples in by_family.items():
        lines.append(f"# TYPE {name} gauge")
        lines += sorted(samples, key=lambda line: (line.split(" ")[0], int(line.split(" ")[2])))
    return "\n".join([*lines, "# EOF"]) + "\n"


PROMETHEUS_CONFIG = "global:\n  scrape_interval: 30s\n"
"""No scrape targets: the backfilled blocks are all the data."""
