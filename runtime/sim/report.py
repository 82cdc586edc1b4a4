"""Figures of merit of a replay, and the pooled-versus-fixed comparison (pure).

Definitions (docs/whatif.md repeats them for readers of a report):
- useful tokens/s: generated tokens of completed flex requests plus production's, where
  production's are its served busy GPU-equivalents times one saturated replica's generated
  tokens/s (an upper bound of what production produces, so the pooled/fixed ratio is
  conservative: production counts the same in both replays);
- harvestable GPU-hours: GPU-hours no production pod needed (all GPUs minus production's
  replicas); harvested: GPU-hours held by running flex replicas;
- production minutes unmet: pod-minutes a production pod was Pending (wanted a GPU, had none);
- evictions per minute: flex pods disrupted by someone else, counted over the policy's rate
  window as the eviction alert counts them (mean and maximum over the replay);
- KV hit rate: prefix-cache hit tokens per queried prompt token (traces with block hashes);
- KV work lost: context tokens of in-flight sequences on replicas that went away;
- KV snapshot tier (``KvTier``): the prefix hit rate of the requests served in the first
  minute after each eviction of a running flex replica, with the tier and without it, on the
  same served requests whatever the policy's mode, and the prefill tokens the tier saves
  over the replay;
- traffic classes (``ClassFigures``, a policy with a ``serving`` section): per class the
  requests served, queued at the end, shed by the endpoint picker, dropped and lost in flight
  at pod exits, each with its share of the arrivals, and the requests shed during production
  bursts: the steps in which production's pods held more GPUs than their median over the
  replay (none in the fixed topology, where production holds its peak throughout), and those
  shed at the start, before the replay's first flex replica was ready (the pooled replay
  starts flex cold; the fixed topology starts with its replicas running).

The product's goals (``goals``) are judged on the pooled replay and reported met or missed,
never hidden: harvest efficiency >= 0.8, 0 production pod-minutes unmet, at most 5 flex
evictions per minute at any time, and >= 3x useful tokens/s where production holds 3-4x the
flex pool's GPUs (the setting of the 2-4x claim; elsewhere that goal is not applicable).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policy.base import duration_seconds
from policy.pool import PoolPolicy
from runtime.sim.classes import ClassTotals
from runtime.sim.engine import Replay, preserves_kv


@dataclass(frozen=True)
class Requests:
    arrived: int
    completed: int
    outstanding: int
    dropped: int


@dataclass(frozen=True)
class KvTier:
    """What the KV snapshot tier buys in one replay, counted on the same served requests with
    the tier and without it (``runtime.sim.serving``) whatever the policy's mode, so a policy
    without the tier shows what turning it on would buy. ``note`` says why the first-minute
    rates are absent (None where they are given)."""

    kv_preservation: str
    """The policy's ``kv_cache.kv_preservation``."""
    served_with_tier: bool
    """Whether the replay itself served with the tier (only ``filesystem`` outlives a pod)."""
    evicted_replicas: int
    """Running flex replicas preempted (the evictions the first-minute rates follow)."""
    first_minute_query_tokens: int
    """Prompt tokens (of requests with block hashes) served in those minutes, per eviction."""
    first_minute_hit_rate_with_tier: float | None
    first_minute_hit_rate_without_tier: float | None
    prefill_tokens_saved: float | None
    """Prefix hits with the tier minus without over the whole replay: prefill recompute the
    tier avoids, after every replica exit (scale-downs too); None without block hashes."""
    note: str | None


def kv_tier(replay: Replay, policy: PoolPolicy) -> KvTier:
    """The tier's figures of ``replay`` (token-weighted over all evictions and workloads)."""
    totals = replay.fleets.values()
    after = [t.after_evictions for t in totals]
    evicted = sum(a.evicted_replicas for a in after)
    queried = sum(a.query_tokens for a in after)
    kept = sum(a.hit_tokens_with_tier for a in after)
    survived = sum(a.hit_tokens_without_tier for a in after)
    hashed = any(t.query_tokens for t in totals)
    if not hashed:
        note: str | None = "no served request has block hashes"
    elif not evicted:
        note = "no running flex replica evicted"
    elif not kept:
        note = "no prefix reuse after evictions"
    else:
        note = None
    return KvTier(
        kv_preservation=policy.kv_cache.kv_preservation,
        served_with_tier=preserves_kv(policy),
        evicted_replicas=evicted,
        first_minute_query_tokens=queried,
        first_minute_hit_rate_with_tier=None if note else kept / queried,
        first_minute_hit_rate_without_tier=None if note else survived / queried,
        prefill_tokens_saved=(
            float(sum(t.hit_tokens_with_tier - t.hit_tokens_without_tier for t in totals))
            if hashed
            else None
        ),
        note=note,
    )


@dataclass(frozen=True)
class ClassFigures:
    """One traffic class over a replay; ``arrived == served + queued + shed + dropped +
    lost``, and the shares are of ``arrived``."""

    priority: int
    served_by: str
    sheddable: bool
    arrived: int
    served: int
    queued: int
    """Admitted and not finished when the replay ended."""
    shed: int
    """Refused by the endpoint picker (the client got 429/503)."""
    dropped: int
    """Longer than ``max_model_len``."""
    lost: int
    """In flight on a pod that exited and not finished within its drain window."""
    drained: int
    """In flight on a pod that exited and finished within it (counted in ``served``)."""
    served_share: float | None
    queued_share: float | None
    shed_share: float | None
    shed_during_bursts: int
    """Shed in the steps production's pods held more GPUs than their median (``burst_minutes``)."""
    burst_minutes: float
    shed_at_start: int
    """Shed before the replay's first flex replica was ready (``start_minutes``): the replay's
    cold start, not a production burst."""
    start_minutes: float


def class_figures(replay: Replay) -> dict[str, ClassFigures] | None:
    """The traffic classes' figures of ``replay`` (None: it had no traffic classes)."""
    if not replay.classes:
        return None
    held = replay.series.array("prod_gpus")
    burst = held > float(np.median(held)) if held.size else np.zeros(0, dtype=bool)
    running = replay.series.array("flex_running_gpus") > 0
    ready = int(np.argmax(running)) if running.any() else running.size
    start = np.arange(running.size) < ready
    return {name: _figures(t, burst, start, replay.step_s) for name, t in replay.classes.items()}


def _figures(t: ClassTotals, burst: np.ndarray, start: np.ndarray, step_s: float) -> ClassFigures:
    """One class's figures; shares are None for a class no request arrived in."""

    def share(n: int) -> float | None:
        return n / t.arrived if t.arrived else None

    shed = np.asarray(t.shed_by_step, dtype=np.int64)
    return ClassFigures(
        priority=t.priority,
        served_by=t.served_by,
        sheddable=t.sheddable,
        arrived=t.arrived,
        served=t.served,
        queued=t.queued,
        shed=t.shed,
        dropped=t.dropped,
        lost=t.lost,
        drained=t.drained,
        served_share=share(t.served),
        queued_share=share(t.queued),
        shed_share=share(t.shed),
        shed_during_bursts=int(shed[burst[: shed.size]].sum()),
        burst_minutes=float(burst.sum() * step_s / 60),
        shed_at_start=int(shed[start[: shed.size]].sum()),
        start_minutes=float(start.sum() * step_s / 60),
    )


@dataclass(frozen=True)
class Summary:
    """One replay's figures; ``checks`` are the closed-loop properties (0 = holds)."""

    name: str
    hours: float
    useful_tokens_per_s: float
    flex_tokens_per_s: float
    prod_tokens_per_s: float
    flex_tokens: int
    harvestable_gpu_h: float
    harvested_gpu_h: float
    harvest_efficiency: float
    prod_unmet_pod_minutes: float
    prod_unmet_max_pods: int
    prod_short_gpu_h: float
    """Busy GPU-hours production wanted while too few of its replicas were ready."""
    evictions_per_minute_mean: float
    evictions_per_minute_max: float
    evictions_total: int
    kv_hit_rate: float | None
    kv_tokens_lost: float
    kv_tier: KvTier
    allocation_share: dict[str, float]
    duty_cycle: dict[str, float]
    flex_duty_cycle: float
    requests: dict[str, Requests]
    checks: dict[str, float]
    traffic_classes: dict[str, ClassFigures] | None = None
    """Per traffic class (a policy with a ``serving`` section); None without one, and then
    absent from the JSON."""


def summarize(replay: Replay, policy: PoolPolicy) -> Summary:
    s, dt = replay.series, replay.step_s
    hours = len(s.t) * dt / 3600
    seconds = max(len(s.t) * dt, dt)
    prod_tokens = float(s.array("prod_busy_served").sum() * dt * replay.prod_tokens_per_gpu_s)
    flex_tokens = int(s.array("flex_tokens").sum())
    harvestable = float(np.clip(s.array("total_gpus") - s.array("prod_need"), 0, None).sum())
    harvested = float(s.array("flex_running_gpus").sum())
    window = max(1, round(duration_seconds(policy.metrics.rate_window) / dt))
    evictions = s.array("evictions")
    per_minute = np.convolve(evictions, np.ones(window), mode="full")[: evictions.size] / (
        window * dt / 60
    )
    hits = sum(t.hit_tokens for t in replay.fleets.values())
    queries = sum(t.query_tokens for t in replay.fleets.values())
    flex_running = s.array("flex_running_gpus")
    pending = s.array("prod_pending")
    return Summary(
        name=replay.name,
        hours=hours,
        useful_tokens_per_s=(prod_tokens + flex_tokens) / seconds,
        flex_tokens_per_s=flex_tokens / seconds,
        prod_tokens_per_s=prod_tokens / seconds,
        flex_tokens=flex_tokens,
        harvestable_gpu_h=harvestable * dt / 3600,
        harvested_gpu_h=harvested * dt / 3600,
        harvest_efficiency=harvested / harvestable if harvestable else 0.0,
        prod_unmet_pod_minutes=float(pending.sum() * dt / 60),
        prod_unmet_max_pods=int(pending.max(initial=0)),
        prod_short_gpu_h=float(
            (s.array("prod_busy") - s.array("prod_busy_served")).clip(0).sum() * dt / 3600
        ),
        evictions_per_minute_mean=float(per_minute.mean()) if per_minute.size else 0.0,
        evictions_per_minute_max=float(per_minute.max(initial=0.0)),
        evictions_total=int(evictions.sum()),
        kv_hit_rate=hits / queries if queries else None,
        kv_tokens_lost=float(sum(t.kv_tokens_lost for t in replay.fleets.values())),
        kv_tier=kv_tier(replay, policy),
        allocation_share=_means(s.alloc_by_pool),
        duty_cycle=_means(s.util_by_pool),
        flex_duty_cycle=float(
            (s.array("flex_duty") * flex_running).sum() / flex_running.sum()
            if flex_running.sum()
            else 0.0
        ),
        requests={
            name: Requests(t.arrived, t.completed, t.outstanding, t.dropped)
            for name, t in replay.fleets.items()
        },
        checks={
            "flex_pods_pending_max": float(s.array("flex_pending").max(initial=0)),
            "flex_budget_beyond_pool_gpus_max": float(s.array("budget_over_free").max(initial=0)),
            "flex_self_shed_minutes": float(s.array("self_shed").sum() * dt / 60),
            "prod_waited_while_flex_ran_pod_minutes": float(
                (pending * (flex_running > 0)).sum() * dt / 60
            ),
            "prod_wait_max_s": float(s.array("prod_wait_max_s").max(initial=0.0)),
            # Preempted flex pods exit within their shutdown budget; the loop binds the
            # production pod at the next step.
            "prod_wait_bound_s": policy.disruption.shutdown_budget_s + dt,
        },
        traffic_classes=class_figures(replay),
    )


def _means(series: dict[str, list[float]]) -> dict[str, float]:
    return {pool: float(np.mean(v)) if v else 0.0 for pool, v in series.items()}


MIN_HARVEST_EFFICIENCY = 0.8
MAX_EVICTIONS_PER_MINUTE = 5.0
MIN_THROUGHPUT_RATIO = 3.0
THROUGHPUT_SETTING = (3.0, 4.0)
"""Production-to-flex GPU ratios where the throughput goal applies."""


@dataclass(frozen=True)
class Goal:
    """One product goal as this replay scored it; ``met`` is None where it does not apply."""

    name: str
    target: str
    value: str
    met: bool | None


def goals(pooled: Summary, throughput_ratio: float, production_to_flex: float) -> tuple[Goal, ...]:
    """The product's goals on a pooled replay (module docstring)."""
    low, high = THROUGHPUT_SETTING
    applies = low <= production_to_flex <= high
    return (
        Goal(
            "harvest efficiency",
            f">= {MIN_HARVEST_EFFICIENCY:g}",
            f"{pooled.harvest_efficiency:.2f}",
            pooled.harvest_efficiency >= MIN_HARVEST_EFFICIENCY,
        ),
        Goal(
            "production pod-minutes unmet",
            "0",
            f"{pooled.prod_unmet_pod_minutes:.1f}",
            pooled.prod_unmet_pod_minutes == 0,
        ),
        Goal(
            "flex evictions per minute (max)",
            f"<= {MAX_EVICTIONS_PER_MINUTE:g}",
            f"{pooled.evictions_per_minute_max:.2f}",
            pooled.evictions_per_minute_max <= MAX_EVICTIONS_PER_MINUTE,
        ),
        Goal(
            "useful tokens/s, pooled / fixed",
            f">= {MIN_THROUGHPUT_RATIO:g}x where production holds {low:g}-{high:g}x flex's GPUs",
            f"{throughput_ratio:.2f}x (production holds {production_to_flex:.1f}x)",
            throughput_ratio >= MIN_THROUGHPUT_RATIO if applies else None,
        ),
    )
