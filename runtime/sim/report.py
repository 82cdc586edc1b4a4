"""Figures of merit of a replay (pure).

Definitions (docs/whatif.md repeats them for readers of a report). Every figure compared
between the replays is in one unit, GPU-hours of work; no figure values one model's work at
another model's rate:
- useful GPU-hours: production's busy GPU-equivalents it was served plus flex's busy
  GPU-equivalents (its running GPUs times their duty cycle), summed over the replay;
- cluster duty cycle: useful GPU-hours over the GPU-hours of the cluster's GPUs;
- harvested GPU-hours: GPU-hours held by running flex replicas;
- harvest bound: per step, every GPU minus the GPUs production's busy GPU-equivalents fill
  (rounded up: a GPU is held whole), clipped at 0; what no pooler can beat without taking a
  GPU production was busy on. Harvest efficiency: harvested / bound;
- production busy GPU-hours short: busy GPU-hours production wanted but was not served
  (too few of its replicas ready); production pod-minutes pending, by why they waited
  (``cluster.Waiting``: a preemption's victims exiting, free GPUs on no single node, too few
  free GPUs);
- flex capped hours: per workload, the hours its budget asked for more replicas than its
  HPA's ``maxReplicas`` (the bound, not the cluster, limited it);
- evictions per minute: flex pods disrupted by someone else, counted over the policy's rate
  window as the eviction alert counts them (mean and maximum over the replay);
- flex tokens/s: generated tokens of completed flex requests per second (flex's models only,
  compared with flex's own in the fixed topology);
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

The product's goals on these figures: ``runtime.sim.goals``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from policy.base import duration_seconds
from policy.pool import PoolPolicy
from runtime.sim.classes import ClassTotals
from runtime.sim.cluster_objects import Waiting
from runtime.sim.fleet_pools import preserves_kv
from runtime.sim.replay_model import Replay


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
class HarvestLosses:
    """The harvest bound's GPU-hours that running flex replicas did not hold, by where they
    went, in GPU-hours. They sum to bound minus harvested at every step where production
    holds at least its busy GPU-equivalents rounded up (it holds fewer only while short)."""

    production_headroom: float
    """Held by production beyond its busy GPU-equivalents rounded up: its replicas' own
    headroom (HPA target, replica size, ``min_replicas``), which whole-GPU pooling cannot
    lend."""
    reserve: float
    """Unallocated, up to what the pools' reserves keep free."""
    other_free: float
    """Unallocated beyond the reserves (growth the budget or the HPA did not take)."""
    flex_starting: float
    """Held by flex replicas that were starting or stopping."""

    def largest(self) -> str:
        """The causes, largest first: ``reserve 266, production headroom 208, ...``."""
        parts = sorted(asdict(self).items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name.replace('_', ' ')} {value:,.0f}" for name, value in parts)


HOURS_PER_MONTH = 730.0
"""365 x 24 / 12: a month's GPU-hours per GPU, for values per month."""


@dataclass(frozen=True)
class HarvestValue:
    """What the harvested GPU-hours are worth at the pools' ``cost`` (``node_pools[].cost``)."""

    currency: str
    amount: float
    """Over the replay."""
    per_month: float
    """``amount`` at the replay's rate for ``HOURS_PER_MONTH`` hours."""
    unpriced_gpu_h: float
    """Harvested GPU-hours on pools without a ``cost`` (not in ``amount``)."""

    def text(self) -> str:
        """``USD 4,566 (USD 146,080 a month)``, and what was left unpriced."""
        out = f"{self.currency} {self.amount:,.0f} ({self.currency} {self.per_month:,.0f} a month)"
        if self.unpriced_gpu_h:
            out += f"; {self.unpriced_gpu_h:,.1f} GPU-h on pools without a cost not valued"
        return out


def harvest_value(replay: Replay, policy: PoolPolicy) -> HarvestValue | None:
    """The pooled replay's harvest valued per pool; None without prices or a split by pool
    (the fixed topology's flex GPUs belong to no pool)."""
    currency = policy.currency
    by_pool = replay.series.flex_by_pool
    if currency is None or not by_pool:
        return None
    amount = unpriced = 0.0
    for pool in policy.node_pools:
        held = gpu_hours(np.asarray(by_pool.get(pool.name, ()), dtype=np.float64), replay.step_s)
        if pool.cost is None:
            unpriced += held
        else:
            amount += held * pool.cost.gpu_hour
    hours = len(replay.series.t) * replay.step_s / 3600
    per_month = amount * HOURS_PER_MONTH / hours if hours else 0.0
    return HarvestValue(currency, amount, per_month, unpriced)


@dataclass(frozen=True)
class Summary:
    """One replay's figures; ``checks`` are the closed-loop properties (0 = holds). GPU-hours
    throughout: the module docstring defines each figure."""

    name: str
    hours: float
    useful_gpu_h: float
    """Production's served busy GPU-hours plus flex's busy GPU-hours."""
    cluster_duty_cycle: float
    """``useful_gpu_h`` over ``total_gpu_h``."""
    total_gpu_h: float
    """GPU-hours of the cluster's GPUs (its nodes, as the replay had them)."""
    prod_busy_gpu_h: float
    """Busy GPU-hours production wanted (its trace; the same in both replays)."""
    prod_served_gpu_h: float
    flex_busy_gpu_h: float
    """GPU-hours of running flex replicas times their duty cycle."""
    harvested_gpu_h: float
    """GPU-hours held by running flex replicas."""
    harvest_bound_gpu_h: float
    """Per step: all GPUs minus ceil(production's busy GPU-equivalents), clipped at 0."""
    harvest_efficiency: float | None
    """``harvested_gpu_h / harvest_bound_gpu_h``; None where the bound is 0."""
    harvest_lost: HarvestLosses
    """Where the bound's GPU-hours went that running flex did not hold."""
    harvest_value: HarvestValue | None
    """What ``harvested_gpu_h`` is worth at the pools' prices (pooled, priced pools only)."""
    prod_short_gpu_h: float
    """Busy GPU-hours production wanted while too few of its replicas were ready."""
    prod_unmet_pod_minutes: float
    """Pod-minutes production pods were Pending, all causes."""
    prod_unmet_max_pods: int
    prod_pending_pod_minutes: dict[str, float]
    """``prod_unmet_pod_minutes`` by why the pods waited: preemption, fragmented, capacity."""
    evictions_per_minute_mean: float
    evictions_per_minute_max: float
    evictions_total: int
    flex_tokens_per_s: float
    flex_tokens: int
    flex_capped_h: dict[str, float]
    """Per workload: hours its budget asked for more than its HPA's maxReplicas (the pooled
    replay; empty in the fixed topology, whose replicas are fixed)."""
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


CEIL_SLACK = 1e-9
"""Busy GPU-equivalents within this of a whole GPU count as that GPU (float noise)."""


def gpu_hours(values: NDArray[np.float64], step_s: float) -> float:
    """GPU-hours of a per-step series of GPUs (or GPU-equivalents)."""
    return float(values.sum() * step_s / 3600)


def harvest_bound(
    total_gpus: NDArray[np.float64], prod_busy: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Per step, the GPUs no pooler can harvest past without taking a GPU production is busy
    on: every GPU minus ceil(production's busy GPU-equivalents), clipped at 0."""
    wanted = np.ceil(np.clip(prod_busy, 0, None) - CEIL_SLACK)
    bound: NDArray[np.float64] = np.clip(total_gpus - wanted, 0, None)
    return bound


def harvest_losses(replay: Replay, reserve_gpus: int) -> HarvestLosses:
    """``HarvestLosses`` of ``replay``; ``reserve_gpus``: what the pools' reserves keep free
    (``whatif.Result.reserve_gpus``, every node schedulable)."""
    s, dt = replay.series, replay.step_s
    total, free = s.array("total_gpus"), s.array("free_gpus")
    busy_whole = total - harvest_bound(total, s.array("prod_busy"))
    kept = np.minimum(free, float(reserve_gpus))
    return HarvestLosses(
        production_headroom=gpu_hours(np.clip(s.array("prod_gpus") - busy_whole, 0, None), dt),
        reserve=gpu_hours(kept, dt),
        other_free=gpu_hours(free - kept, dt),
        flex_starting=gpu_hours(s.array("flex_gpus") - s.array("flex_running_gpus"), dt),
    )


def summarize(replay: Replay, policy: PoolPolicy, *, reserve_gpus: int = 0) -> Summary:
    """``replay``'s figures; ``reserve_gpus`` splits its unallocated GPUs into the reserve
    and the rest (``HarvestLosses``)."""
    s, dt = replay.series, replay.step_s
    seconds = max(len(s.t) * dt, dt)
    flex_tokens = int(s.array("flex_tokens").sum())
    flex_running = s.array("flex_running_gpus")
    total = s.array("total_gpus")
    prod_busy = s.array("prod_busy")
    served = s.array("prod_busy_served")
    flex_busy = s.array("flex_duty") * flex_running
    useful = gpu_hours(served + flex_busy, dt)
    total_h = gpu_hours(total, dt)
    harvested = gpu_hours(flex_running, dt)
    bound = gpu_hours(harvest_bound(total, prod_busy), dt)
    per_minute = _evictions_per_minute(replay, policy)
    pending = s.array("prod_pending")
    return Summary(
        name=replay.name,
        hours=len(s.t) * dt / 3600,
        useful_gpu_h=useful,
        cluster_duty_cycle=useful / total_h if total_h else 0.0,
        total_gpu_h=total_h,
        prod_busy_gpu_h=gpu_hours(prod_busy, dt),
        prod_served_gpu_h=gpu_hours(served, dt),
        flex_busy_gpu_h=gpu_hours(flex_busy, dt),
        harvested_gpu_h=harvested,
        harvest_bound_gpu_h=bound,
        harvest_efficiency=harvested / bound if bound else None,
        harvest_lost=harvest_losses(replay, reserve_gpus),
        harvest_value=harvest_value(replay, policy),
        prod_short_gpu_h=gpu_hours((prod_busy - served).clip(0), dt),
        prod_unmet_pod_minutes=float(pending.sum() * dt / 60),
        prod_unmet_max_pods=int(pending.max(initial=0)),
        prod_pending_pod_minutes=_pending_by_cause(replay),
        evictions_per_minute_mean=float(per_minute.mean()) if per_minute.size else 0.0,
        evictions_per_minute_max=float(per_minute.max(initial=0.0)),
        evictions_total=int(s.array("evictions").sum()),
        flex_tokens_per_s=flex_tokens / seconds,
        flex_tokens=flex_tokens,
        flex_capped_h={name: sum(steps) * dt / 3600 for name, steps in s.capped.items()},
        kv_hit_rate=_kv_hit_rate(replay),
        kv_tokens_lost=float(sum(t.kv_tokens_lost for t in replay.fleets.values())),
        kv_tier=kv_tier(replay, policy),
        allocation_share=_means(s.alloc_by_pool),
        duty_cycle=_means(s.util_by_pool),
        flex_duty_cycle=float(flex_busy.sum() / flex_running.sum() if flex_running.sum() else 0.0),
        requests=_requests(replay),
        checks=_checks(replay, policy),
        traffic_classes=class_figures(replay),
    )


def _evictions_per_minute(replay: Replay, policy: PoolPolicy) -> NDArray[np.floating[Any]]:
    """Per step: flex evictions per minute over the policy's rate window, as the eviction
    alert counts them."""
    dt = replay.step_s
    window = max(1, round(duration_seconds(policy.metrics.rate_window) / dt))
    evictions = replay.series.array("evictions")
    in_window = np.convolve(evictions, np.ones(window), mode="full")[: evictions.size]
    return in_window / (window * dt / 60)


def _pending_by_cause(replay: Replay) -> dict[str, float]:
    """Production pod-minutes pending by ``Waiting`` cause."""
    s, dt = replay.series, replay.step_s
    return {
        cause.value: float(sum(s.prod_pending_by_cause.get(cause, ())) * dt / 60)
        for cause in Waiting
    }


def _kv_hit_rate(replay: Replay) -> float | None:
    """Prefix-cache hit tokens per queried prompt token; None where nothing was queried."""
    hits = sum(t.hit_tokens for t in replay.fleets.values())
    queries = sum(t.query_tokens for t in replay.fleets.values())
    return hits / queries if queries else None


def _requests(replay: Replay) -> dict[str, Requests]:
    return {
        name: Requests(t.arrived, t.completed, t.outstanding, t.dropped)
        for name, t in replay.fleets.items()
    }


def _checks(replay: Replay, policy: PoolPolicy) -> dict[str, float]:
    """The closed-loop properties (``Summary.checks``)."""
    s, dt = replay.series, replay.step_s
    pending = s.array("prod_pending")
    flex_running = s.array("flex_running_gpus")
    return {
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
    }


def _means(series: dict[str, list[float]]) -> dict[str, float]:
    return {pool: float(np.mean(v)) if v else 0.0 for pool, v in series.items()}
