"""What one cycle saw: each series' samples over the window, and whether it may be trusted.

Pure: the Prometheus edge fills a ``MetricsSnapshot``; decisions ask ``usable`` for the
windows they need and fail closed on anything it refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Window:
    """One series over the observation window, label sets already combined."""

    name: str
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
    unreachable: str | None = None
    """Set when Prometheus could not be queried; every decision then fails closed."""


def usable(
    snapshot: MetricsSnapshot,
    name: str,
    *,
    stale_after_s: float,
    min_observation_s: float,
) -> Window | Unusable:
    """The window of ``name`` if it is present, fresh, NaN-free and long enough."""
    if snapshot.unreachable is not None:
        return Unusable(name, "unreachable", f"Prometheus unreachable: {snapshot.unreachable}")
    window = snapshot.windows.get(name)
    if window is None or not window.samples:
        return Unusable(name, "absent", f"{name} has no samples in the window")
    age = snapshot.at - window.samples[-1][0]
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
