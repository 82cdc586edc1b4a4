"""The product's goals, judged on every what-if report and reported met or missed, never hidden.

``goals`` scores the pooled replay against the fixed topology (``runtime.sim.report``'s
figures): useful GPU-hours >= 2.5x the fixed topology's where the fixed topology's cluster
duty cycle is at most 30 % (elsewhere not applicable); harvest efficiency >= 0.85 of the
bound; production's busy GPU-hours short no more than the fixed topology's plus 0.1 % of
production's busy GPU-hours; at most 5 flex evictions per minute at any time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from runtime.sim.cluster_objects import Waiting
from runtime.sim.report import Summary

MIN_USEFUL_RATIO = 2.5
"""Pooled over fixed useful GPU-hours, where the fixed topology leaves the cluster idle."""
USEFUL_RATIO_WHERE_DUTY_AT_MOST = 0.30
"""The useful GPU-hours goal applies where the fixed topology's cluster duty cycle is at
most this (a busier cluster has less idle time to win back)."""
MIN_HARVEST_EFFICIENCY = 0.85
PROD_SHORT_ALLOWANCE = 0.001
"""Production may be short its fixed-topology GPU-hours plus this share of its busy ones."""
MAX_EVICTIONS_PER_MINUTE = 5.0


def prod_short_allowed(pooled: Summary, fixed: Summary) -> float:
    """The busy GPU-hours production may be short in the pooled replay and count unharmed:
    the fixed topology's plus ``PROD_SHORT_ALLOWANCE`` of production's busy GPU-hours."""
    return fixed.prod_short_gpu_h + PROD_SHORT_ALLOWANCE * pooled.prod_busy_gpu_h


def production_unharmed(pooled: Summary, fixed: Summary) -> bool:
    """Whether pooling left production no shorter than the goal allows."""
    return pooled.prod_short_gpu_h <= prod_short_allowed(pooled, fixed)


@dataclass(frozen=True)
class Goal:
    """One product goal as this replay scored it; ``met`` is None where it does not apply."""

    name: str
    target: str
    value: str
    met: bool | None
    cause: str | None = None
    """Why it was MISSED and what would change that (None unless missed)."""


HARVEST_REMEDIES = {
    "production_headroom": "production's replicas hold GPUs beyond their busy share (its HPA "
    "target, replica size, min_replicas), which whole-GPU pooling cannot lend",
    "reserve": "the pools' reserves keep them free (lower reserve_ratio or the slot reserve)",
    "other_free": "unallocated GPUs flex's budget or HPA did not take (flex max_replicas, "
    "the elastic thresholds)",
    "flex_starting": "flex replicas starting or stopping (pod start-up time)",
}
"""``HarvestLosses`` field -> what holds those GPU-hours back, and the lever."""


def _harvest_cause(pooled: Summary) -> str:
    lost = asdict(pooled.harvest_lost)
    largest = max(lost, key=lambda k: lost[k])
    return f"{lost[largest]:,.0f} GPU-h of the bound: {HARVEST_REMEDIES[largest]}"


def _useful_cause(pooled: Summary, fixed: Summary) -> str:
    return (
        f"flex held {pooled.harvested_gpu_h:,.1f} GPU-h and kept them busy "
        f"{pooled.flex_duty_cycle:.0%} of the time ({pooled.flex_busy_gpu_h:,.1f} useful "
        f"GPU-h over the fixed topology's {fixed.useful_gpu_h:,.1f}): flex's offered work is "
        "the limit; a batch backlog (--backlog) fills idle flex GPUs"
    )


def _short_cause(pooled: Summary) -> str:
    waited = pooled.prod_pending_pod_minutes
    worst = max(waited, key=lambda k: waited[k], default=Waiting.CAPACITY.value)
    why = {
        Waiting.PREEMPTION.value: "waiting for preempted flex pods to exit (a shorter flex "
        "drain, or a larger reserve)",
        Waiting.FRAGMENTED.value: "free GPUs on no single node (a slot reserve keeps whole "
        "replicas' room)",
        Waiting.CAPACITY.value: "too few free GPUs (a larger reserve, or flex shedding sooner)",
    }[worst]
    return f"production pods pending {sum(waited.values()):,.1f} pod-minutes, mostly {why}"


def _evictions_cause(pooled: Summary) -> str:
    return (
        f"production took GPUs back from {pooled.evictions_total:,} flex pods: a larger reserve "
        "or slower flex growth (elastic thresholds) evicts fewer"
    )


def goals(pooled: Summary, fixed: Summary, useful_gpu_h_ratio: float) -> tuple[Goal, ...]:
    """The product's goals on the pooled replay against the fixed topology (module
    docstring)."""
    applies = fixed.cluster_duty_cycle <= USEFUL_RATIO_WHERE_DUTY_AT_MOST
    allowed = prod_short_allowed(pooled, fixed)
    efficiency = pooled.harvest_efficiency
    useful = useful_gpu_h_ratio >= MIN_USEFUL_RATIO if applies else None
    harvest = None if efficiency is None else efficiency >= MIN_HARVEST_EFFICIENCY
    unharmed = production_unharmed(pooled, fixed)
    calm = pooled.evictions_per_minute_max <= MAX_EVICTIONS_PER_MINUTE
    return (
        Goal(
            "useful GPU-hours, pooled / fixed",
            f">= {MIN_USEFUL_RATIO:g}x where the fixed topology's cluster duty cycle is at most "
            f"{USEFUL_RATIO_WHERE_DUTY_AT_MOST:.0%}",
            f"{useful_gpu_h_ratio:.2f}x (fixed duty cycle {fixed.cluster_duty_cycle:.1%})",
            useful,
            _useful_cause(pooled, fixed) if useful is False else None,
        ),
        Goal(
            "harvest efficiency",
            f">= {MIN_HARVEST_EFFICIENCY:g} of the bound",
            "n/a (no GPU-hours to harvest)"
            if efficiency is None
            else f"{efficiency:.3f} (GPU-h of the bound not harvested: "
            f"{pooled.harvest_lost.largest()})",
            harvest,
            _harvest_cause(pooled) if harvest is False else None,
        ),
        Goal(
            "production busy GPU-hours short",
            f"<= the fixed topology's + {PROD_SHORT_ALLOWANCE:.1%} of production's busy GPU-h",
            f"{pooled.prod_short_gpu_h:,.2f} (fixed {fixed.prod_short_gpu_h:,.2f}, "
            f"allowed {allowed:,.2f})",
            unharmed,
            None if unharmed else _short_cause(pooled),
        ),
        Goal(
            "flex evictions per minute (max)",
            f"<= {MAX_EVICTIONS_PER_MINUTE:g}",
            f"{pooled.evictions_per_minute_max:.2f}",
            calm,
            None if calm else _evictions_cause(pooled),
        ),
    )
