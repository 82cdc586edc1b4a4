"""The recorded series the tuner reads, and how one cycle folds their label sets into one line.

Names come from the metrics catalogue (``runtime/metrics``); this module only says which of
them the tuner needs and how to combine several label sets of one series at a timestamp
(the recording rules of one group evaluate at the same instants, so timestamps align).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from enum import Enum

from runtime.metrics import catalogue


class Combine(Enum):
    """How the label sets of one series merge at a timestamp."""

    SUM = "sum"
    """Counts and rates add up across pools and workloads."""
    MEAN = "mean"
    """Cluster-wide ratios (one series in practice)."""
    MAX = "max"
    """The fullest instance decides whether KV is short."""
    MIN = "min"
    """The worst hit rate decides whether KV helps."""


SIGNALS: dict[str, Combine] = {
    catalogue.CLUSTER_GPU_UTILIZATION: Combine.MEAN,
    catalogue.FLEX_EVICTIONS: Combine.SUM,
    catalogue.PROD_PODS_PENDING: Combine.SUM,
    catalogue.VLLM_QUEUE_DEPTH: Combine.SUM,
    catalogue.FLEX_HEADROOM_GPUS: Combine.SUM,
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
