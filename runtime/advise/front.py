"""The sweep's trade-off: harvest against production harm, the Pareto front, the pick (pure).

Harm is what production lost to pooling: busy GPU-hours it was short plus pod-minutes its
pods were Pending (the two figures a platform team weighs; each is also shown alone).
A variant is on the front when no other variant harvests at least as much with no more
harm, better in one.

The recommendation is the acceptable variant with the most harvest; ties go to less harm,
then to fewer changes. Acceptable: production unharmed by the product's goal (busy
GPU-hours short no more than the fixed topology's plus 0.1 % of production's busy
GPU-hours), its pods pending no longer than under the current policy or the fixed topology,
whichever is longer, and flex evictions at most 5 per minute. Production never waits in the
fixed topology, while any pooling makes it wait for a preemption's graceful exit, so
"pending no longer than the fixed topology" alone would reject every pooled policy; the
current policy's waits are what the owner accepts today.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.advise.sweep import Point
from runtime.sim.goals import MAX_EVICTIONS_PER_MINUTE, production_unharmed
from runtime.sim.report import Summary

PENDING_SLACK = 1e-9
"""Pod-minutes within this of the accepted waits count as equal (float noise)."""


def harm(summary: Summary) -> float:
    """Production's busy GPU-hours short plus its pod-minutes pending."""
    return summary.prod_short_gpu_h + summary.prod_unmet_pod_minutes


@dataclass(frozen=True)
class Rated:
    """A replayed variant with what the pick weighs."""

    point: Point
    summary: Summary
    harm: float
    on_front: bool
    refused: str | None
    """Why the pick may not take it (production short, waiting longer than accepted, too
    many evictions); None: acceptable."""

    @property
    def acceptable(self) -> bool:
        return self.refused is None


def rate(points: Sequence[Point], fixed: Summary) -> list[Rated]:
    """Every replayed point, rated (points without a summary are left out); ``points[0]`` is
    the current policy."""
    replayed = [(p, p.summary) for p in points if p.summary is not None]
    current = points[0].summary
    waits = max(
        fixed.prod_unmet_pod_minutes, 0.0 if current is None else current.prod_unmet_pod_minutes
    )
    out = []
    for point, summary in replayed:
        h = harm(summary)
        dominated = any(dominates(other, summary) for _, other in replayed)
        out.append(Rated(point, summary, h, not dominated, _refused(summary, fixed, waits)))
    return out


def dominates(a: Summary, b: Summary) -> bool:
    """``a`` harvests at least as much as ``b`` with no more harm, and is better in one."""
    gain, loss = a.harvested_gpu_h - b.harvested_gpu_h, harm(a) - harm(b)
    return gain >= 0 and loss <= 0 and (gain > 0 or loss < 0)


def _refused(summary: Summary, fixed: Summary, waits: float) -> str | None:
    if not production_unharmed(summary, fixed):
        return "production short"
    if summary.prod_unmet_pod_minutes > waits + PENDING_SLACK:
        return "production waits longer"
    if summary.evictions_per_minute_max > MAX_EVICTIONS_PER_MINUTE:
        return "evictions over 5/min"
    return None


def recommend(rated: Sequence[Rated]) -> Rated | None:
    """The acceptable variant with the most harvest (ties: less harm, fewer edits); None
    when no variant is acceptable."""
    acceptable = [r for r in rated if r.acceptable]
    if not acceptable:
        return None
    return max(
        acceptable,
        key=lambda r: (r.summary.harvested_gpu_h, -r.harm, -len(r.point.variant.edits)),
    )
