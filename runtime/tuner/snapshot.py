"""What one cycle saw: each series' samples over the window, and whether it may be trusted.

Pure: the Prometheus edge fills a ``MetricsSnapshot`` with every label set it read
(``series``) and one combined line per series (``windows``); decisions ask ``usable`` (or
``check`` for a window split by labels) for the windows they need and fail closed on
anything refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
"""Label pairs of one series, sorted by name (``__name__`` left out)."""


def selector(name: str, labels: Labels) -> str:
    """``name{a="x",b="y"}`` (just ``name`` without labels): how windows name themselves."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def series_name(name: str) -> str:
    """The recorded series' name of a (possibly labelled) window name."""
    return name.split("{", 1)[0]


@dataclass(frozen=True)
class Series:
    """One label set of a series as Prometheus returned it."""

    labels: Labels
    samples: tuple[tuple[float, float], ...]
    """``(unix seconds, value)``, oldest first."""

    def label(self, name: str) -> str:
        """The value of label ``name`` ("" when absent, as in PromQL)."""
        return next((v for k, v in self.labels if k == name), "")


@dataclass(frozen=True)
class Window:
    """One series over the observation window: label sets combined, or one split of them."""

    name: str
    """The series' name, with the labels it was split by (``selector``)."""
    samples: tuple[tuple[float, float], ...]
    """``(unix seconds, value)``, oldest first."""

    @property
    def span_s(self) -> float:
        return self.samples[-1][0] - self.samples[0][0] if self.samples else 0.0

    @property
    def values(self) -> list[float]:
        return [v for _, v in self.samples]

    def share(self, condition: Callable[[float], bool]) -> float:
        """Fraction of samples meeting ``condition`` (0 for an empty window)."""
        values = self.values
        return sum(1 for v in values if condition(v)) / len(values) if values else 0.0

    def summary(self) -> str:
        """``min / mean / max / last over N samples, S s`` for logs and PR evidence."""
        values = self.values
        mean = math.fsum(values) / len(values)
        return (
            f"min {min(values):.4g}, mean {mean:.4g}, max {max(values):.4g}, "
            f"last {values[-1]:.4g} over {len(values)} samples spanning {self.span_s:.0f} s"
        )


@dataclass(frozen=True)
class Unusable:
    """Why a series cannot back a decision; ``kind`` labels the fail-closed metric."""

    name: str
    kind: str
    """``unreachable``, ``absent``, ``stale``, ``nan`` or ``short``."""
    reason: str


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one cycle read, as of ``at`` (unix seconds)."""

    at: float
    windows: Mapping[str, Window] = field(default_factory=dict)
    """One combined line per series (``signals.SIGNALS`` says how label sets combine)."""
    unreachable: str | None = None
    """Set when Prometheus could not be queried; every decision then fails closed."""
    series: Mapping[str, tuple[Series, ...]] = field(default_factory=dict)
    """Every label set of each series as read: rules that judge per reason, per instance or
    per workload split these (``signals.split``) instead of reading the combined line."""


def check(
    window: Window | None,
    name: str,
    *,
    at: float,
    stale_after_s: float,
    min_observation_s: float,
) -> Window | Unusable:
    """``window`` if it is present, fresh, NaN-free and long enough."""
    if window is None or not window.samples:
        return Unusable(name, "absent", f"{name} has no samples in the window")
    age = at - window.samples[-1][0]
    if age > stale_after_s:
        return Unusable(
            name, "stale", f"{name} newest sample is {age:.0f} s old (limit {stale_after_s:.0f} s)"
        )
    if any(math.isnan(v) for v in window.values):
        return Unusable(name, "nan", f"{name} has NaN samples in the window")
    if window.span_s < min_observation_s:
        return Unusable(
            name,
            "short",
            f"{name} spans {window.span_s:.0f} s of the {min_observation_s:.0f} s "
            "minimum observation window",
        )
    return window


def usable(
    snapshot: MetricsSnapshot,
    name: str,
    *,
    stale_after_s: float,
    min_observation_s: float,
) -> Window | Unusable:
    """The combined window of ``name`` if it is present, fresh, NaN-free and long enough."""
    if snapshot.unreachable is not None:
        return Unusable(name, "unreachable", f"Prometheus unreachable: {snapshot.unreachable}")
    return check(
        snapshot.windows.get(name),
        name,
        at=snapshot.at,
        stale_after_s=stale_after_s,
        min_observation_s=min_observation_s,
    )
