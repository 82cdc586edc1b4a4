"""The recorded series the tuner reads, and how one cycle folds their label sets into lines.

Names come from the metrics catalogue (``runtime/metrics``); this module only says which of
them the tuner needs and how to combine several label sets of one series at a timestamp
(the recording rules of one group evaluate at the same instants, so timestamps align).

The combined line of a series (``MetricsSnapshot.windows``) is what the fail-closed checks,
logs and PR bodies show. Rules that must not pair one label set's sample with another's
split the series instead (``split``): evictions per reason, KV usage and hit rate per vLLM
instance, queue and HPA bound per workload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum

from runtime.metrics import catalogue
from runtime.tuner.snapshot import Labels, MetricsSnapshot, Series, Window, selector


class Combine(Enum):
    """How the label sets of one series merge at a timestamp."""

    SUM = "sum"
    """Counts and rates add up across pools, reasons and workloads."""
    MEAN = "mean"
    """Cluster-wide ratios (one series in practice)."""
    MAX = "max"
    """The fullest instance (display only: KV decisions judge each instance)."""
    MIN = "min"
    """The worst instance or workload (display only: decisions split these series)."""


SIGNALS: dict[str, Combine] = {
    catalogue.PRODUCTION_GPU_UTILIZATION: Combine.MEAN,
    catalogue.FLEX_EVICTIONS: Combine.SUM,
    catalogue.PROD_PODS_PENDING: Combine.SUM,
    catalogue.VLLM_QUEUE_DEPTH: Combine.SUM,
    catalogue.FLEX_HEADROOM_GPUS: Combine.SUM,
    catalogue.FLEX_HPA_AT_MAX: Combine.MIN,
    catalogue.KV_CACHE_USAGE: Combine.MAX,
    catalogue.KV_CACHE_HIT_RATE: Combine.MIN,
}
"""Every series one tuning cycle queries (one range-selector query each)."""

_REDUCERS: dict[Combine, Callable[[Sequence[float]], float]] = {
    Combine.SUM: math.fsum,
    Combine.MEAN: lambda values: math.fsum(values) / len(values),
    Combine.MAX: max,
    Combine.MIN: min,
}


def combine(
    series: Iterable[Sequence[tuple[float, float]]], how: Combine
) -> tuple[tuple[float, float], ...]:
    """One ``(time, value)`` line from several label sets' samples; NaN stays NaN."""
    by_time: dict[float, list[float]] = {}
    for samples in series:
        for t, v in samples:
            by_time.setdefault(t, []).append(v)
    reduce = _REDUCERS[how]
    return tuple(
        (t, math.nan if any(math.isnan(v) for v in vs) else reduce(vs))
        for t, vs in sorted(by_time.items())
    )


def snapshot_of(
    at: float,
    series: Mapping[str, Sequence[Series]],
    unreachable: str | None = None,
    *,
    how: Mapping[str, Combine] = SIGNALS,
) -> MetricsSnapshot:
    """A snapshot holding every label set read and each series' combined line."""
    kept = {name: tuple(found) for name, found in series.items()}
    windows = {
        name: Window(name, combine((s.samples for s in found), how[name]))
        for name, found in kept.items()
    }
    return MetricsSnapshot(at=at, windows=windows, unreachable=unreachable, series=kept)


def split(snapshot: MetricsSnapshot, name: str, by: Sequence[str]) -> dict[tuple[str, ...], Window]:
    """One window per value tuple of the labels ``by`` (missing labels read ""), the label
    sets sharing a value tuple combined as ``SIGNALS[name]`` says."""
    groups: dict[tuple[str, ...], list[Series]] = {}
    for found in snapshot.series.get(name, ()):
        groups.setdefault(tuple(found.label(b) for b in by), []).append(found)
    out: dict[tuple[str, ...], Window] = {}
    for key, members in sorted(groups.items()):
        labels: Labels = tuple(zip(by, key, strict=True))
        out[key] = Window(
            selector(name, labels), combine((s.samples for s in members), SIGNALS[name])
        )
    return out
