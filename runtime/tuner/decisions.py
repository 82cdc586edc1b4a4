"""Pure tuning decisions: (policy, metric windows, tuner state, settings) -> proposal or no-op.

Each rule reads only the windows it needs and fails closed: a missing, stale or NaN series
is a reasoned no-op, never a guess. One cycle proposes at most one policy change (safety
first: an eviction storm outranks KV capacity, which outranks more flex replicas), and
none inside the cooldown after the last proposal. Every proposed policy is validated with
the policy's own invariants before it is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy import PolicyError, PoolPolicy, parse_policy
from policy.base import duration_seconds
from runtime.metrics import catalogue
from runtime.tuner.settings import TunerSettings
from runtime.tuner.snapshot import MetricsSnapshot, Unusable, Window, usable

PolicyPath = tuple[str | int, ...]
"""Path of a scalar in the policy document, e.g. ``("elastic", "shed_above")``."""


@dataclass(frozen=True)
class Change:
    """One scalar of the policy, before and after."""

    path: PolicyPath
    before: float
    after: float

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path)


@dataclass(frozen=True)
class Evidence:
    """A window that backed a decision and the condition it met."""

    series: str
    condition: str
    summary: str


@dataclass(frozen=True)
class Proposal:
    """A reviewed policy change the tuner wants; becomes a branch and a PR."""

    rule: str
    title: str
    changes: tuple[Change, ...]
    rationale: str
    expected_effect: str
    evidence: tuple[Evidence, ...]
    adds_flex_load: bool


@dataclass(frozen=True)
class CompactionRequest:
    """Ask the KV compaction worker to compact: the cache is sparse, not short."""

    reason: str
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class NoOp:
    """A rule that decided nothing, and why; ``fail_closed`` names the bad data's kind."""

    rule: str
    reason: str
    fail_closed: str | None = None


Outcome = Proposal | CompactionRequest | NoOp


@dataclass(frozen=True)
class TunerState:
    """What the tuner remembers between cycles (persisted by the state edge)."""

    last_proposal_at: float | None = None
    last_proposal_branch: str | None = None
    last_compaction_at: float | None = None


@dataclass(frozen=True)
class CycleDecision:
    """The outcome of one cycle: at most one proposal, maybe a compaction request, and why."""

    proposal: Proposal | None
    compaction: CompactionRequest | None
    noops: tuple[NoOp, ...] = field(default_factory=tuple)


class _Missing(Exception):
    def __init__(self, unusable: Unusable) -> None:
        self.unusable = unusable


def _usable(
    policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings, name: str
) -> Window | Unusable:
    interval_s = duration_seconds(policy.metrics.evaluation_interval)
    return usable(
        snapshot,
        name,
        stale_after_s=settings.stale_after_intervals * interval_s,
        min_observation_s=settings.min_observation_s,
    )


def _windows(
    policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings, names: Sequence[str]
) -> list[Window]:
    found = []
    for name in names:
        got = _usable(policy, snapshot, settings, name)
        if isinstance(got, Unusable):
            raise _Missing(got)
        found.append(got)
    return found


def _noop_for(rule: str, missing: _Missing, what: str) -> NoOp:
    u = missing.unusable
    kind = None if u.kind == "short" else u.kind
    verb = "not enough history" if kind is None else "fail closed"
    return NoOp(rule, f"{verb}: {u.reason}; {what}", kind)


def _sustained(window: Window, test: Callable[[float], bool], condition: str) -> Evidence:
    return Evidence(
        window.name, f"{condition} in {window.share(test):.0%} of samples", window.summary()
    )


def apply_changes(policy: PoolPolicy, changes: Sequence[Change]) -> PoolPolicy:
    """The policy with ``changes`` applied, validated; raises PolicyError on a broken rule."""
    document: Any = policy.model_dump(mode="json", by_alias=True)
    for change in changes:
        node = document
        for part in change.path[:-1]:
            node = node[part]
        node[change.path[-1]] = change.after
    return parse_policy(document, "<proposed policy>")


def _step(current: float, step: float, bound: float, digits: int = 4) -> float:
    return round(min(current + step, bound), digits)


def eviction_storm(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """Sustained flex evictions above the alert limit: relax by one bounded step.

    The lever follows the evidence. Production pods pending during the storm mean
    production bursts collide with flex: raise the production reserve so flex never counts
    on those GPUs. Otherwise, utilization reaching the shed band means flex is shed and
    regrown around ``shed_above``: raise it to widen the hysteresis band (only with fresh
    proof that production is not waiting, as it keeps more flex). Otherwise the churn is the
    autoscaler's: lengthen the scale-down stabilization window.
    """
    rule = "eviction-storm"
    limit = policy.alerting.thresholds.flex_eviction_rate.per_minute_max
    try:
        (evictions,) = _windows(policy, snapshot, settings, [catalogue.FLEX_EVICTIONS])
    except _Missing as missing:
        return _noop_for(rule, missing, "cannot judge evictions")
    above = evictions.share(lambda v: v > limit)
    if above < settings.persistence:
        return NoOp(
            rule,
            f"evictions above {limit}/min in {above:.0%} of samples, "
            f"below the {settings.persistence:.0%} needed to call it sustained",
        )
    evidence = [_sustained(evictions, lambda v: v > limit, f"> {limit}/min")]
    got_pending = _usable(policy, snapshot, settings, catalogue.PROD_PODS_PENDING)
    got_utilization = _usable(policy, snapshot, settings, catalogue.CLUSTER_GPU_UTILIZATION)
    pending = got_pending if isinstance(got_pending, Window) else None
    utilization = got_utilization if isinstance(got_utilization, Window) else None
    prod_index = policy.node_pools.index(policy.prod_pool)
    reserve = policy.prod_pool.reserve_ratio
    prod_waiting = pending is not None and max(pending.values) > 0
    if pending is not None and prod_waiting and reserve < settings.reserve_ratio_max:
        evidence.append(_sustained(pending, lambda v: v > 0, "> 0 pending"))
        after = _step(reserve, settings.reserve_ratio_step, settings.reserve_ratio_max)
        return Proposal(
            rule,
            f"Raise the production reserve to {after:g} (flex evictions above {limit}/min)",
            (Change(("node_pools", prod_index, "reserve_ratio"), reserve, after),),
            "Production pods were pending while flex pods were evicted: production bursts "
            "collide with flex. A larger production reserve keeps GPUs free for bursts, so "
            "the scheduler no longer preempts flex to place production.",
            f"Fewer flex evictions; flex loses up to {after - reserve:.0%} of the production "
            "pool as usable headroom.",
            tuple(evidence),
            adds_flex_load=False,
        )
    shed = policy.elastic.shed_above
    band = shed - settings.ratio_margin
    reaches_band = utilization is not None and max(utilization.values) >= band
    if (
        pending is not None
        and utilization is not None
        and not prod_waiting
        and reaches_band
        and shed < settings.shed_above_max
    ):
        evidence.append(
            _sustained(utilization, lambda v: v >= band, f">= shed_above - margin ({band:g})")
        )
        evidence.append(_sustained(pending, lambda v: v == 0, "no production pending"))
        after = _step(shed, settings.shed_above_step, settings.shed_above_max)
        return Proposal(
            rule,
            f"Raise elastic.shed_above to {after:g} (flex evictions above {limit}/min)",
            (Change(("elastic", "shed_above"), shed, after),),
            "Utilization reached the shed threshold while no production pod waited: flex is "
            "shed and regrown around shed_above. Raising it widens the hysteresis band "
            f"({policy.elastic.scale_up_below:g}-{after:g}) so flex stops flapping.",
            "Fewer flex evictions from shedding; flex keeps GPUs up to a higher cluster "
            "utilization (production still preempts it at any time).",
            tuple(evidence),
            adds_flex_load=True,
        )
    window_s = policy.autoscaling.scale_down_stabilization_s
    if window_s >= settings.scale_down_stabilization_max_s:
        return NoOp(
            rule,
            "sustained evictions, but every lever is at its bound: reserve_ratio "
            f"{reserve:g}/{settings.reserve_ratio_max:g}, shed_above {shed:g}/"
            f"{settings.shed_above_max:g}, scale_down_stabilization_s {window_s}/"
            f"{settings.scale_down_stabilization_max_s}; a person must look",
        )
    after_s = int(
        _step(
            window_s,
            settings.scale_down_stabilization_step_s,
            settings.scale_down_stabilization_max_s,
        )
    )
    if pending is None or utilization is None:
        why = "production-pending or utilization data is unusable, so no lever that keeps "
        why += "more flex is taken"
    elif prod_waiting:
        why = f"production pods were pending but reserve_ratio is at its bound {reserve:g}"
    elif reaches_band:
        why = f"utilization reached the shed band but shed_above is at its bound {shed:g}"
    else:
        why = "production pods were not pending and utilization stayed below the shed band"
    return Proposal(
        rule,
        f"Lengthen scale-down stabilization to {after_s} s (flex evictions above {limit}/min)",
        (Change(("autoscaling", "scale_down_stabilization_s"), window_s, after_s),),
        f"Evictions were sustained, {why}: the churn is the autoscaler removing and "
        "re-adding replicas. A longer scale-down window damps it.",
        "Fewer flex replica removals and re-creations; flex capacity follows drops in demand "
        f"{after_s - window_s} s later.",
        tuple(evidence),
        adds_flex_load=False,
    )


def idle_flex_demand(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """Utilization persistently below the scale-up threshold while flex requests queue:
    widen the flex replica bounds, within the flex pools' GPU capacity.

    It adds flex load, so it needs fresh proof of all five: utilization, queue, idle flex
    GPUs to grow into (headroom), no pending production pod and no eviction storm.
    """
    rule = "idle-flex-demand"
    try:
        utilization, queue, headroom, pending, evictions = _windows(
            policy,
            snapshot,
            settings,
            [
                catalogue.CLUSTER_GPU_UTILIZATION,
                catalogue.VLLM_QUEUE_DEPTH,
                catalogue.FLEX_HEADROOM_GPUS,
                catalogue.PROD_PODS_PENDING,
                catalogue.FLEX_EVICTIONS,
            ],
        )
    except _Missing as missing:
        return _noop_for(rule, missing, "no change that adds flex load")
    below = policy.elastic.scale_up_below - settings.ratio_margin
    idle = utilization.share(lambda v: v < below)
    queued = queue.share(lambda v: v > 0)
    limit = policy.alerting.thresholds.flex_eviction_rate.per_minute_max
    if idle < settings.persistence or queued < settings.persistence:
        return NoOp(
            rule,
            f"utilization below {below:g} in {idle:.0%} and flex requests queued in "
            f"{queued:.0%} of samples; both must reach {settings.persistence:.0%}",
        )
    if max(pending.values) > 0 or max(evictions.values) > limit:
        return NoOp(
            rule,
            "the cluster looks idle but production pods were pending or flex evictions "
            f"exceeded {limit}/min: no more flex",
        )
    if headroom.share(lambda v: v > 0) < settings.persistence:
        return NoOp(
            rule,
            "flex requests queue but the flex pools had no idle GPUs (flex_headroom_gpus) "
            "to grow into; more replicas would stay pending",
        )
    changes = []
    for i, workload in enumerate(policy.workloads):
        capacity = policy.pool_of(workload).gpu_capacity
        bound = capacity // workload.gpus_per_replica
        after = min(workload.max_replicas + settings.flex_replicas_step, bound)
        if after > workload.max_replicas:
            changes.append(Change(("workloads", i, "max_replicas"), workload.max_replicas, after))
    if not changes:
        return NoOp(
            rule,
            "flex demand is queued but every workload's max_replicas already "
            "fills its flex pool's GPUs; add flex nodes (node_pools.*.max_nodes)",
        )
    return Proposal(
        rule,
        "Widen flex replica bounds (idle cluster, queued flex requests)",
        tuple(changes),
        f"Cluster GPU utilization stayed below scale_up_below - margin ({below:g}) while flex "
        "requests queued, no production pod waited and evictions stayed within the limit: "
        "the HPA is capped by max_replicas, not by the cluster.",
        "The HPA may add up to "
        f"{sum(int(c.after - c.before) for c in changes)} more flex replicas; the queue "
        "drains and utilization rises toward scale_up_below.",
        (
            _sustained(utilization, lambda v: v < below, f"< {below:g}"),
            _sustained(queue, lambda v: v > 0, "> 0 queued"),
            _sustained(headroom, lambda v: v > 0, "> 0 idle flex GPUs"),
            _sustained(pending, lambda v: v == 0, "no production pending"),
            _sustained(evictions, lambda v: v <= limit, f"<= {limit}/min"),
        ),
        adds_flex_load=True,
    )


def kv_capacity(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
) -> Proposal | CompactionRequest | NoOp:
    """Hit rate below the alert floor: more KV capacity if the cache is full, compaction if
    it is sparse (fragmented or cold), nothing in between."""
    rule = "kv-hit-rate"
    try:
        hit_rate, kv_usage = _windows(
            policy, snapshot, settings, [catalogue.KV_CACHE_HIT_RATE, catalogue.KV_CACHE_USAGE]
        )
    except _Missing as missing:
        return _noop_for(rule, missing, "no KV change")
    floor = policy.alerting.thresholds.kv_hit_rate.min - settings.ratio_margin
    low = hit_rate.share(lambda v: v < floor)
    if low < settings.persistence:
        return NoOp(rule, f"hit rate below {floor:g} in {low:.0%} of samples; not sustained")
    kv = policy.kv_cache
    full_at = kv.page_table_max_usage
    sparse_below = kv.compaction_usage_below
    hit_evidence = _sustained(hit_rate, lambda v: v < floor, f"< {floor:g}")
    if kv_usage.share(lambda v: v >= full_at) >= settings.persistence:
        after = _step(kv.max_gpu_memory_share, settings.kv_share_step, settings.kv_share_max)
        if after <= kv.max_gpu_memory_share:
            return NoOp(
                rule,
                f"KV is full but max_gpu_memory_share is at the tuner's bound "
                f"{settings.kv_share_max:g}",
            )
        return Proposal(
            rule,
            f"Raise kv_cache.max_gpu_memory_share to {after:g} (hit rate below {floor:g})",
            (Change(("kv_cache", "max_gpu_memory_share"), kv.max_gpu_memory_share, after),),
            f"The prefix-cache hit rate stayed low while KV usage stayed at or above "
            f"page_table_max_usage ({full_at:g}): cached prefixes are evicted for lack of "
            "blocks. More KV memory keeps them.",
            f"About {(after - kv.max_gpu_memory_share) / kv.max_gpu_memory_share:.0%} more KV "
            "blocks per flex instance and a higher hit rate; less burst headroom in GPU memory.",
            (hit_evidence, _sustained(kv_usage, lambda v: v >= full_at, f">= {full_at:g}")),
            adds_flex_load=False,
        )
    if kv_usage.share(lambda v: v < sparse_below) >= settings.persistence:
        interval = duration_seconds(kv.compaction_min_interval)
        last = state.last_compaction_at
        if last is not None and snapshot.at - last < interval:
            return NoOp(
                rule,
                f"compaction requested {snapshot.at - last:.0f} s ago; "
                f"kv_cache.compaction_min_interval is {kv.compaction_min_interval}",
            )
        return CompactionRequest(
            f"hit rate below {floor:g} with KV usage below compaction_usage_below "
            f"({sparse_below:g}): the cache is sparse, not short; compact instead of adding "
            "capacity",
            (hit_evidence, _sustained(kv_usage, lambda v: v < sparse_below, f"< {sparse_below:g}")),
        )
    return NoOp(
        rule,
        f"hit rate is low but KV usage is neither full (>= {full_at:g}) nor "
        f"sparse (< {sparse_below:g}) in {settings.persistence:.0%} of samples",
    )


def decide(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
) -> CycleDecision:
    """Run every rule; keep the first valid proposal by priority, unless in cooldown."""
    outcomes: list[Outcome] = [
        eviction_storm(policy=policy, snapshot=snapshot, settings=settings),
        kv_capacity(policy=policy, snapshot=snapshot, state=state, settings=settings),
        idle_flex_demand(policy=policy, snapshot=snapshot, settings=settings),
    ]
    noops: list[NoOp] = [o for o in outcomes if isinstance(o, NoOp)]
    compaction = next((o for o in outcomes if isinstance(o, CompactionRequest)), None)
    proposal: Proposal | None = None
    for candidate in (o for o in outcomes if isinstance(o, Proposal)):
        if proposal is not None:
            noops.append(NoOp(candidate.rule, f"deferred: {proposal.rule} goes first"))
            continue
        since = None if state.last_proposal_at is None else snapshot.at - state.last_proposal_at
        if since is not None and since < settings.cooldown_s:
            noops.append(
                NoOp(
                    candidate.rule,
                    f"cooldown: last proposal {since:.0f} s ago, cooldown {settings.cooldown}",
                )
            )
            continue
        try:
            apply_changes(policy, candidate.changes)
        except PolicyError as exc:
            noops.append(NoOp(candidate.rule, f"proposed policy is invalid, not proposed: {exc}"))
            continue
        proposal = candidate
    return CycleDecision(proposal, compaction, tuple(noops))
