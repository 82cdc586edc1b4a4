"""Pure tuning decisions: (policy, metric windows, tuner state, settings) -> proposal or no-op.

Each rule reads only the windows it needs and fails closed: a missing, stale or NaN series
is a reasoned no-op, never a guess. Every condition that leads to a proposal must be
*sustained* (hold in ``settings.persistence`` of its window's samples), never one sample;
the only single-sample tests are vetoes that stop a change adding flex load. One cycle
proposes at most one policy change (safety first: an eviction storm outranks KV capacity,
which outranks more flex replicas), and none inside the cooldown after the last proposal.
Every proposed policy is validated with the policy's own invariants before it is returned.

Every rule takes one ``RuleContext`` and runs as phases of its own (gather the windows,
check persistence, vetoes, choose the lever, build the outcome); the words of every
outcome are ``rule_text``'s (docs/design/tuner-rules.md).

Every policy change is one step of a ``Lever`` (``LEVERS``): the fields the tuner may move,
each of which changes what the cluster does (a recording rule, an HPA or a flex
Deployment's arguments), not only the policy's own ConfigMap copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import runtime.tuner.rule_text as rule_text
from policy import PolicyError, PoolPolicy, parse_policy
from policy.base import duration_seconds
from policy.workloads import FlexWorkload
from runtime.metrics import catalogue, evictions
from runtime.tuner.proposals import (
    Change,
    CompactionRequest,
    CycleDecision,
    Evidence,
    NoOp,
    Outcome,
    PolicyPath,
    Proposal,
    TunerState,
)
from runtime.tuner.rule_text import ProposalText
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import split
from runtime.tuner.snapshot import MetricsSnapshot, Unusable, Window, check, usable
from runtime.vllm import BackendError, KvPlanError, ModelSpec, plan_kv_cache

__all__ = [
    "LEVERS",
    "REASON_LABEL",
    "Change",
    "CompactionRequest",
    "CycleDecision",
    "Evidence",
    "Lever",
    "NoOp",
    "Outcome",
    "PolicyPath",
    "Proposal",
    "RuleContext",
    "TunerState",
    "apply_changes",
    "decide",
    "eviction_storm",
    "idle_flex_demand",
    "kv_capacity",
]
"""The values live in ``proposals``; they are importable from here as before."""

EVICTION_STORM = "eviction-storm"
KV_HIT_RATE = "kv-hit-rate"
IDLE_FLEX_DEMAND = "idle-flex-demand"
"""Rule names: the proposals' and no-ops' ``rule``, the metrics' label, the branch prefix."""


@dataclass(frozen=True)
class RuleContext:
    """Everything a rule may read: one cycle's policy, windows, memory, settings and the
    committed model configs (each workload's, by name; the KV rule sizes its cache)."""

    policy: PoolPolicy
    snapshot: MetricsSnapshot
    settings: TunerSettings
    state: TunerState = field(default_factory=TunerState)
    models: Mapping[str, ModelSpec] = field(default_factory=dict)

    @property
    def persistence(self) -> float:
        return self.settings.persistence

    @property
    def eviction_limit(self) -> float:
        """The alert's flex eviction rate limit, per minute."""
        return self.policy.alerting.thresholds.flex_eviction_rate.per_minute_max

    def usable(self, name: str) -> Window | Unusable:
        """The combined window of ``name``, or why it cannot be trusted."""
        stale_after_s, min_observation_s = self._limits()
        return usable(
            self.snapshot, name, stale_after_s=stale_after_s, min_observation_s=min_observation_s
        )

    def windows(self, names: Sequence[str]) -> list[Window]:
        """The windows of ``names``; raises ``_Missing`` on the first that is unusable."""
        found = []
        for name in names:
            got = self.usable(name)
            if isinstance(got, Unusable):
                raise _Missing(got)
            found.append(got)
        return found

    def split(self, name: str, by: Sequence[str]) -> dict[tuple[str, ...], Window]:
        """The usable windows of ``name`` per value tuple of ``by``; unusable splits (an
        instance that started recently, a workload gone stale) are left out."""
        stale_after_s, min_observation_s = self._limits()
        out = {}
        for key, window in split(self.snapshot, name, by).items():
            got = check(
                window,
                window.name,
                at=self.snapshot.at,
                stale_after_s=stale_after_s,
                min_observation_s=min_observation_s,
            )
            if isinstance(got, Window):
                out[key] = got
        return out

    def _limits(self) -> tuple[float, float]:
        interval_s = duration_seconds(self.policy.metrics.evaluation_interval)
        return self.settings.stale_after_intervals * interval_s, self.settings.min_observation_s


# --- levers: the only policy fields the tuner moves ----------------------------------------


@dataclass(frozen=True)
class Lever:
    """One policy field the tuner may move by one bounded step, and what that changes in the
    rendered bundle (tests/tuner/test_levers.py renders every lever's step and checks it)."""

    name: str
    field: str
    acts_on: str
    """The rendered object the step changes (a recording rule, an HPA, a Deployment)."""
    adds_flex_load: bool
    steps: Callable[[PoolPolicy, TunerSettings], tuple[Change, ...]]
    """The lever's next step from ``policy``; empty when it is at its bound."""


def _step(current: float, step: float, bound: float, digits: int = 4) -> float:
    return round(min(current + step, bound), digits)


def _step_down(current: float, step: float, bound: float, digits: int = 4) -> float:
    return round(max(current - step, bound), digits)


def _prod_reserve_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    now = policy.prod_pool.reserve_ratio
    after = _step(now, settings.reserve_ratio_step, settings.reserve_ratio_max)
    path = ("node_pools", policy.node_pools.index(policy.prod_pool), "reserve_ratio")
    return (Change(path, now, after, PROD_RESERVE.name),) if after > now else ()


def _shed_threshold_floor(policy: PoolPolicy, settings: TunerSettings) -> float:
    """The lowest ``elastic.shed_while_production_above`` the tuner proposes: the settings'
    ``shed_threshold_min``, and never within ``ratio_margin`` of the grow threshold (the
    band must stay a band: the policy's invariant only asks grow < shed)."""
    grow = policy.elastic.grow_while_production_below
    return round(max(settings.shed_threshold_min, grow + settings.ratio_margin), 4)


def _shed_threshold_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    """One step DOWN: flex sheds at a lower production utilization, i.e. earlier."""
    now = policy.elastic.shed_while_production_above
    floor = _shed_threshold_floor(policy, settings)
    after = _step_down(now, settings.shed_threshold_step, floor)
    path = ("elastic", "shed_while_production_above")
    return (Change(path, now, after, SHED_THRESHOLD.name),) if after < now else ()


def _flex_max_replicas_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    """Every workload with an explicit bound that can still grow: + ``flex_replicas_step``, at
    most what its pools hold; the rule keeps only the workloads whose HPA runs at its bound
    (``max_replicas: auto`` is that already)."""
    changes = []
    for i, workload in enumerate(policy.workloads):
        if workload.max_replicas == "auto":
            continue
        bound = policy.replica_capacity(workload)
        after = min(workload.max_replicas + settings.flex_replicas_step, bound)
        if after > workload.max_replicas:
            path = ("workloads", i, "max_replicas")
            changes.append(Change(path, workload.max_replicas, after, FLEX_MAX_REPLICAS.name))
    return tuple(changes)


def _kv_share_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    now = policy.kv_cache.max_gpu_memory_share
    after = _step(now, settings.kv_share_step, settings.kv_share_max)
    path = ("kv_cache", "max_gpu_memory_share")
    return (Change(path, now, after, KV_SHARE.name),) if after > now else ()


PROD_RESERVE = Lever(
    "prod-reserve",
    "node_pools[<prod pool>].reserve_ratio",
    "the gpupool:reserved_gpus recording rule: the GPUs every pool keeps unallocated",
    False,
    _prod_reserve_step,
)
SHED_THRESHOLD = Lever(
    "shed-threshold",
    "elastic.shed_while_production_above",
    "the gpupool:flex_budget_step recording rule: when flex sheds one HPA step",
    False,
    _shed_threshold_step,
)
FLEX_MAX_REPLICAS = Lever(
    "flex-max-replicas",
    "workloads[*].max_replicas",
    "the flex workload's HPA maxReplicas",
    True,
    _flex_max_replicas_step,
)
KV_SHARE = Lever(
    "kv-share",
    "kv_cache.max_gpu_memory_share",
    "the flex Deployments' --kv-cache-memory-bytes (where the share cap bounds it)",
    False,
    _kv_share_step,
)
LEVERS: tuple[Lever, ...] = (
    PROD_RESERVE,
    SHED_THRESHOLD,
    FLEX_MAX_REPLICAS,
    KV_SHARE,
)
"""Every lever the tuner can propose; a proposal's changes all come from one of these."""


# --- shared phases --------------------------------------------------------------------------


class _Missing(Exception):
    def __init__(self, unusable: Unusable) -> None:
        self.unusable = unusable


def _noop_for(rule: str, missing: _Missing, what: str) -> NoOp:
    u = missing.unusable
    return NoOp(rule, rule_text.unusable(u, what), None if u.kind == "short" else u.kind)


def _sustained(window: Window, test: Callable[[float], bool], condition: str) -> Evidence:
    return Evidence(
        window.name, rule_text.sustained(window.share(test), condition), window.summary()
    )


def _proposal(
    rule: str,
    text: ProposalText,
    changes: tuple[Change, ...],
    evidence: Sequence[Evidence],
    lever: Lever,
) -> Proposal:
    return Proposal(
        rule,
        text.title,
        changes,
        text.why,
        text.effect,
        tuple(evidence),
        adds_flex_load=lever.adds_flex_load,
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


def _valid_step(cx: RuleContext, lever: Lever) -> tuple[tuple[Change, ...], str]:
    """The lever's next step if the policy's own invariants accept it, else no change and
    why not ("" when the lever is at the tuner's bound)."""
    changes = lever.steps(cx.policy, cx.settings)
    if not changes:
        return (), ""
    try:
        apply_changes(cx.policy, changes)
    except PolicyError as exc:
        return (), rule_text.refused(changes[0].dotted, changes[0].after, exc)
    return changes, ""


# --- eviction storm -------------------------------------------------------------------------

REASON_LABEL = "reason"
"""Label of ``gpupool:flex_evictions:per_minute`` naming the canonical reason."""


def _eviction_storm(cx: RuleContext) -> Proposal | NoOp:
    """Sustained flex evictions above the alert limit: one bounded step of the lever the
    dominant reason calls for (docs/tuner.md "Eviction storm: which lever").

    Only scheduler preemption has a pool.yaml lever, and its answer is always that flex give
    GPUs back EARLIER (shedding is not counted as an eviction; shedding later means more
    preemption): raise the production reserve; with the reserve at its bound and
    production's utilization persistently at or near the shed threshold, lower
    ``shed_while_production_above``; otherwise a no-op naming the bounds. Eviction-API,
    kubelet and node-failure storms are no-ops naming the cause for a person.
    """
    limit = cx.eviction_limit
    try:
        (total,) = cx.windows([catalogue.FLEX_EVICTIONS])
    except _Missing as missing:
        return _noop_for(EVICTION_STORM, missing, "cannot judge evictions")
    above = total.share(lambda v: v > limit)
    if above < cx.persistence:
        return NoOp(EVICTION_STORM, rule_text.storm_not_sustained(limit, above, cx.persistence))
    dominant = _dominant_reason(cx, total, limit)
    if dominant is None:
        return NoOp(EVICTION_STORM, rule_text.storm_without_reasons(REASON_LABEL))
    reason, led, window = dominant
    if reason != evictions.PREEMPTION:
        return NoOp(EVICTION_STORM, rule_text.cause_for_a_person(cx.policy, reason, led, limit))
    evidence = (
        _sustained(total, lambda v: v > limit, f"> {limit}/min"),
        Evidence(window.name, rule_text.top_reason(led), window.summary()),
    )
    return _preemption_storm(cx, evidence)


def _dominant_reason(
    cx: RuleContext, total: Window, limit: float
) -> tuple[str, float, Window] | None:
    """The reason with the most evictions in most of the storm's samples (one vote per sample
    above the limit, so a burst of another reason in one sample cannot steer the lever), the
    share of storm samples it led, and its window. Ties go to ``evictions.PRECEDENCE``."""
    by_reason = {
        key[0]: window
        for key, window in cx.split(catalogue.FLEX_EVICTIONS, (REASON_LABEL,)).items()
    }
    if not by_reason:
        return None
    order = {reason: i for i, reason in enumerate(evictions.PRECEDENCE)}

    def rank(reason: str) -> int:
        return order.get(reason, len(order))

    at = {reason: dict(window.samples) for reason, window in by_reason.items()}
    storm = [t for t, v in total.samples if v > limit]
    votes: dict[str, int] = {}
    for t in storm:
        values = {reason: samples.get(t, 0.0) for reason, samples in at.items()}
        top = min(values, key=lambda r: (-values[r], rank(r)))
        if values[top] > 0:
            votes[top] = votes.get(top, 0) + 1
    if not votes:
        return None
    reason = min(votes, key=lambda r: (-votes[r], rank(r)))
    return reason, votes[reason] / len(storm), by_reason[reason]


def _preemption_storm(cx: RuleContext, evidence: tuple[Evidence, ...]) -> Proposal | NoOp:
    """Production preempts flex: make flex give its GPUs back before production needs them.

    1. Raise the prod pool's ``reserve_ratio`` (the budget sheds flex whenever unallocated
       GPUs fall under the reserve). A preemption IS production taking flex's GPUs, so
       this needs no other signal; production pods pending is reported as evidence only.
    2. The reserve at its bound (the tuner's or the policy's invariants) and production's
       utilization persistently at or above the shed threshold less the margin: lower
       ``shed_while_production_above`` one step, never below ``_shed_threshold_floor``.
    3. Otherwise a no-op naming the bounds reached, for a person.

    Every lever here keeps less flex, so none needs a veto and none waits for
    production-pending data.
    """
    seen, support = _pending_story(cx)
    changes, refusal = _valid_step(cx, PROD_RESERVE)
    reserve = cx.policy.prod_pool.reserve_ratio
    if changes:
        text = rule_text.raise_reserve(
            reserve=reserve, after=changes[0].after, limit=cx.eviction_limit, seen=seen
        )
        return _proposal(EVICTION_STORM, text, changes, (*evidence, *support), PROD_RESERVE)
    bound = rule_text.reserve_bound(reserve, refusal, cx.settings)
    return _shed_earlier(cx, evidence, support, seen=seen, reserve_bound=bound)


def _pending_story(cx: RuleContext) -> tuple[str, tuple[Evidence, ...]]:
    """What production-pending data says of a preemption storm, and its evidence row (none
    when the window is unusable: the levers here keep less flex and do not need it)."""
    pending = cx.usable(catalogue.PROD_PODS_PENDING)
    if isinstance(pending, Unusable):
        return rule_text.pending_seen(pending, 0.0, cx.persistence), ()
    waited = pending.share(lambda v: v > 0)
    support = (_sustained(pending, lambda v: v > 0, "> 0 pending"),)
    return rule_text.pending_seen(pending, waited, cx.persistence), support


def _shed_earlier(
    cx: RuleContext,
    evidence: tuple[Evidence, ...],
    support: tuple[Evidence, ...],
    *,
    seen: str,
    reserve_bound: str,
) -> Proposal | NoOp:
    """The reserve at its bound: lower the shed threshold when production's utilization
    persistently reached it less the margin, else a no-op naming the bounds."""
    got = cx.usable(catalogue.PRODUCTION_GPU_UTILIZATION)
    if isinstance(got, Unusable):
        what = rule_text.shed_needs_utilization(reserve_bound)
        return _noop_for(EVICTION_STORM, _Missing(got), what)
    shed = cx.policy.elastic.shed_while_production_above
    grow = cx.policy.elastic.grow_while_production_below
    band = round(shed - cx.settings.ratio_margin, 4)
    near = got.share(lambda v: v >= band)
    if near < cx.persistence:
        reason = rule_text.shed_would_not_matter(
            reserve_bound=reserve_bound, band=band, near=near, persistence=cx.persistence, shed=shed
        )
        return NoOp(EVICTION_STORM, reason)
    changes, refusal = _valid_step(cx, SHED_THRESHOLD)
    if not changes:
        reason = rule_text.every_lever_at_its_bound(
            reserve_bound=reserve_bound,
            shed=shed,
            refusal=refusal,
            floor=_shed_threshold_floor(cx.policy, cx.settings),
            grow=grow,
            settings=cx.settings,
        )
        return NoOp(EVICTION_STORM, reason)
    text = rule_text.lower_shed_threshold(
        after=changes[0].after,
        limit=cx.eviction_limit,
        reserve_bound=reserve_bound,
        band=band,
        near=near,
        shed=shed,
        seen=seen,
        grow=grow,
    )
    near_band = _sustained(got, lambda v: v >= band, rule_text.shed_band(band))
    return _proposal(
        EVICTION_STORM, text, changes, (*evidence, near_band, *support), SHED_THRESHOLD
    )


# --- idle production with queued flex demand ------------------------------------------------

_IDLE_SERIES = (
    catalogue.PRODUCTION_GPU_UTILIZATION,
    catalogue.VLLM_QUEUE_DEPTH,
    catalogue.FLEX_HEADROOM_GPUS,
    catalogue.PROD_PODS_PENDING,
    catalogue.FLEX_EVICTIONS,
    catalogue.FLEX_HPA_AT_MAX,
)
"""The six series ``idle_flex_demand`` needs fresh proof of, in the order it unpacks them."""


def _idle_flex_demand(cx: RuleContext) -> Proposal | NoOp:
    """Production persistently below the grow threshold while flex requests queue and the
    HPA runs at its bound: widen the bounds of the workloads at their bound, within their
    flex pools' GPU capacity.

    It adds flex load, so it needs fresh proof of all six series: production utilization,
    queue, idle flex GPUs to grow into (headroom), no pending production pod and no eviction
    storm (both single-sample vetoes), and the HPA at maxReplicas (per workload).
    """
    try:
        utilization, queue, headroom, pending, flex_evictions, _at_max = cx.windows(_IDLE_SERIES)
    except _Missing as missing:
        return _noop_for(IDLE_FLEX_DEMAND, missing, "no change that adds flex load")
    persistence, limit = cx.persistence, cx.eviction_limit
    below = round(cx.policy.elastic.grow_while_production_below - cx.settings.ratio_margin, 4)
    idle = utilization.share(lambda v: v < below)
    queued = queue.share(lambda v: v > 0)
    if idle < persistence or queued < persistence:
        reason = rule_text.not_idle_or_not_queued(
            below=below, idle=idle, queued=queued, persistence=persistence
        )
        return NoOp(IDLE_FLEX_DEMAND, reason)
    # Vetoes (one sample suffices): more flex must never meet waiting production or a storm.
    if max(pending.values) > 0 or max(flex_evictions.values) > limit:
        return NoOp(IDLE_FLEX_DEMAND, rule_text.flex_vetoed(limit))
    if headroom.share(lambda v: v > 0) < persistence:
        return NoOp(IDLE_FLEX_DEMAND, rule_text.no_headroom())
    steps = FLEX_MAX_REPLICAS.steps(cx.policy, cx.settings)
    if not steps:
        return NoOp(IDLE_FLEX_DEMAND, rule_text.no_replica_step())
    changes, per_workload, skipped = _capped_workloads(cx, steps)
    if not changes:
        return NoOp(IDLE_FLEX_DEMAND, rule_text.no_workload_capped(persistence, skipped))
    added = sum(int(c.after - c.before) for c in changes)
    text = rule_text.widen_replicas(below=below, skipped=skipped, added=added)
    evidence = (
        _sustained(utilization, lambda v: v < below, f"< {below:g}"),
        _sustained(queue, lambda v: v > 0, "> 0 queued"),
        _sustained(headroom, lambda v: v > 0, "> 0 idle flex GPUs"),
        _sustained(pending, lambda v: v == 0, "no production pending"),
        _sustained(flex_evictions, lambda v: v <= limit, f"<= {limit}/min"),
        *per_workload,
    )
    return _proposal(IDLE_FLEX_DEMAND, text, changes, evidence, FLEX_MAX_REPLICAS)


def _capped_workloads(
    cx: RuleContext, steps: tuple[Change, ...]
) -> tuple[tuple[Change, ...], list[Evidence], list[str]]:
    """Of the lever's steps, those of workloads whose own HPA ran at maxReplicas AND whose
    own requests queued persistently (their evidence), and the others, described."""
    policy, persistence = cx.policy, cx.persistence
    queues = cx.split(catalogue.VLLM_QUEUE_DEPTH, (policy.metrics.workload_label,))
    bounds = cx.split(catalogue.FLEX_HPA_AT_MAX, (catalogue.BUDGET_LABEL,))
    changes, per_workload, skipped = [], [], []
    for change in steps:
        workload = policy.workloads[int(change.path[1])]
        at_max, waiting = bounds.get((workload.name,)), queues.get((workload.name,))
        capped = at_max is not None and at_max.share(lambda v: v >= 1) >= persistence
        demand = waiting is not None and waiting.share(lambda v: v > 0) >= persistence
        if at_max is not None and waiting is not None and capped and demand:
            changes.append(change)
            per_workload.append(_sustained(at_max, lambda v: v >= 1, "HPA at maxReplicas"))
            per_workload.append(_sustained(waiting, lambda v: v > 0, "> 0 queued"))
        else:
            share = 0.0 if at_max is None else at_max.share(lambda v: v >= 1)
            skipped.append(rule_text.not_widened(workload.name, share, demand))
    return tuple(changes), per_workload, skipped


# --- KV capacity, per instance --------------------------------------------------------------

Instance = tuple[str, ...]
"""A vLLM instance: its values of ``metrics.instance_labels``."""


def _kv_capacity(cx: RuleContext) -> Proposal | CompactionRequest | NoOp:
    """Hit rate below the alert floor, judged per vLLM instance (``metrics.instance_labels``)
    on its own windows: more KV capacity if one instance is persistently low-hit AND
    persistently full, and only when that moves some workload's ``--kv-cache-memory-bytes``;
    compaction if one is low-hit and sparse; nothing otherwise (one instance's low hit rate
    never pairs with another's full cache)."""
    try:
        cx.windows([catalogue.KV_CACHE_HIT_RATE, catalogue.KV_CACHE_USAGE])
    except _Missing as missing:
        return _noop_for(KV_HIT_RATE, missing, "no KV change")
    by = tuple(cx.policy.metrics.instance_labels)
    hits = cx.split(catalogue.KV_CACHE_HIT_RATE, by)
    usages = cx.split(catalogue.KV_CACHE_USAGE, by)
    kv, persistence, floor = cx.policy.kv_cache, cx.persistence, _kv_floor(cx)
    full_at, sparse_below = kv.page_table_max_usage, kv.compaction_usage_below
    low_hit = [k for k, w in hits.items() if w.share(lambda v: v < floor) >= persistence]
    if not low_hit:
        reason = rule_text.no_low_hit_instance(
            floor=floor, persistence=persistence, judged=len(hits)
        )
        return NoOp(KV_HIT_RATE, reason)

    def holding(test: Callable[[float], bool]) -> list[Instance]:
        return [k for k in low_hit if k in usages and usages[k].share(test) >= persistence]

    def evidence(
        keys: list[Instance], test: Callable[[float], bool], cond: str
    ) -> tuple[Evidence, ...]:
        out = []
        for key in keys:
            out.append(_sustained(hits[key], lambda v: v < floor, f"< {floor:g}"))
            out.append(_sustained(usages[key], test, cond))
        return tuple(out)

    full = holding(lambda v: v >= full_at)
    if full:
        return _kv_share(cx, full, evidence(full, lambda v: v >= full_at, f">= {full_at:g}"))
    sparse = holding(lambda v: v < sparse_below)
    if sparse:
        return _compaction(
            cx,
            sparse,
            judged=len(hits),
            evidence=evidence(sparse, lambda v: v < sparse_below, f"< {sparse_below:g}"),
        )
    reason = rule_text.low_hit_but_neither(
        low=len(low_hit), full_at=full_at, sparse_below=sparse_below, persistence=persistence
    )
    return NoOp(KV_HIT_RATE, reason)


def _kv_floor(cx: RuleContext) -> float:
    """The hit rate an instance must stay below: the alert's floor less the margin."""
    return round(cx.policy.alerting.thresholds.kv_hit_rate.min - cx.settings.ratio_margin, 4)


def _compaction(
    cx: RuleContext, sparse: list[Instance], *, judged: int, evidence: tuple[Evidence, ...]
) -> CompactionRequest | NoOp:
    """Low-hit and sparse instances: ask for compaction, at most once a min interval."""
    kv = cx.policy.kv_cache
    last = cx.state.last_compaction_at
    if last is not None and cx.snapshot.at - last < duration_seconds(kv.compaction_min_interval):
        reason = rule_text.compaction_too_soon(cx.snapshot.at - last, kv.compaction_min_interval)
        return NoOp(KV_HIT_RATE, reason)
    reason = rule_text.compact(
        floor=_kv_floor(cx),
        sparse_below=kv.compaction_usage_below,
        sparse=len(sparse),
        judged=judged,
    )
    return CompactionRequest(reason, evidence)


def _kv_bytes(
    policy: PoolPolicy, workload: FlexWorkload, models: Mapping[str, ModelSpec]
) -> int | str:
    """The workload's ``--kv-cache-memory-bytes`` under ``policy``, or why it cannot be sized."""
    model = models.get(workload.name)
    if model is None:
        return rule_text.no_model_config(workload.name, workload.hf_config)
    try:
        return plan_kv_cache(policy, workload, model).kv_cache_bytes
    except (KvPlanError, BackendError) as exc:
        return rule_text.kv_unsized(workload.name, exc)


def _kv_share(
    cx: RuleContext, instances: list[Instance], evidence: tuple[Evidence, ...]
) -> Proposal | NoOp:
    """Low-hit and full instances: one step of the KV share, proposed only when it moves
    some of their workloads' ``--kv-cache-memory-bytes``."""
    changes = KV_SHARE.steps(cx.policy, cx.settings)
    if not changes:
        return NoOp(KV_HIT_RATE, rule_text.kv_share_at_its_bound(cx.settings))
    after_share = changes[0].after
    try:
        proposed = apply_changes(cx.policy, changes)
    except PolicyError as exc:
        return NoOp(KV_HIT_RATE, rule_text.invalid(exc))
    moved, unmoved = _kv_moves(cx, proposed, instances)
    if not moved:
        return NoOp(KV_HIT_RATE, rule_text.kv_share_moves_nothing(after_share, unmoved))
    text = rule_text.raise_kv_share(
        after_share=after_share,
        floor=_kv_floor(cx),
        instances=len(instances),
        full_at=cx.policy.kv_cache.page_table_max_usage,
        moved=moved,
    )
    return _proposal(KV_HIT_RATE, text, changes, evidence, KV_SHARE)


def _kv_moves(
    cx: RuleContext, proposed: PoolPolicy, instances: list[Instance]
) -> tuple[list[str], list[str]]:
    """How ``proposed`` moves the KV bytes of the instances' workloads (every workload when
    the instance labels do not name one): (moved, not moved or not sized), described."""
    policy, labels = cx.policy, cx.policy.metrics.instance_labels
    names = (
        {key[labels.index(policy.metrics.workload_label)] for key in instances}
        if policy.metrics.workload_label in labels
        else set()
    )
    considered = [w for w in policy.workloads if w.name in names] or list(policy.workloads)
    moved, unmoved = [], []
    for workload in considered:
        before = _kv_bytes(policy, workload, cx.models)
        after = _kv_bytes(proposed, workload, cx.models)
        if isinstance(before, str) or isinstance(after, str):
            unmoved.append(before if isinstance(before, str) else str(after))
        elif after != before:
            moved.append(rule_text.kv_moved(workload.name, before, after))
        else:
            unmoved.append(rule_text.kv_unmoved(workload.name, before))
    return moved, unmoved


# --- the cycle's decision -------------------------------------------------------------------

Rule = Callable[[RuleContext], Outcome]

RULES: tuple[Rule, ...] = (_eviction_storm, _kv_capacity, _idle_flex_demand)
"""Every rule, by priority: the first valid proposal wins."""


def decide(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
) -> CycleDecision:
    """Run every rule; keep the first valid proposal by priority, unless in cooldown."""
    cx = RuleContext(policy, snapshot, settings, state, models)
    outcomes = [rule(cx) for rule in RULES]
    noops: list[NoOp] = [o for o in outcomes if isinstance(o, NoOp)]
    compaction = next((o for o in outcomes if isinstance(o, CompactionRequest)), None)
    proposal: Proposal | None = None
    for candidate in (o for o in outcomes if isinstance(o, Proposal)):
        if proposal is not None:
            noops.append(NoOp(candidate.rule, rule_text.deferred(proposal.rule)))
            continue
        refused = _refusal(cx, candidate)
        if refused is not None:
            noops.append(refused)
            continue
        proposal = candidate
    return CycleDecision(proposal, compaction, tuple(noops))


def _refusal(cx: RuleContext, candidate: Proposal) -> NoOp | None:
    """Why the cycle does not propose ``candidate`` (cooldown, an invalid policy), or None.
    A change no lever made is a bug in a rule, not a no-op."""
    levers = {lever.name for lever in LEVERS}
    if any(c.lever not in levers for c in candidate.changes):
        raise RuntimeError(f"{candidate.rule}: a change that no lever made: {candidate}")
    last = cx.state.last_proposal_at
    since = None if last is None else cx.snapshot.at - last
    if since is not None and since < cx.settings.cooldown_s:
        return NoOp(candidate.rule, rule_text.cooldown(since, cx.settings.cooldown))
    try:
        apply_changes(cx.policy, candidate.changes)
    except PolicyError as exc:
        return NoOp(candidate.rule, rule_text.invalid(exc))
    return None


# --- entry points for callers that hold the parts, not a context ----------------------------


def eviction_storm(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """The eviction-storm rule on its own (``_eviction_storm``)."""
    return _eviction_storm(RuleContext(policy, snapshot, settings))


def idle_flex_demand(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """The idle-flex-demand rule on its own (``_idle_flex_demand``)."""
    return _idle_flex_demand(RuleContext(policy, snapshot, settings))


def kv_capacity(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
) -> Proposal | CompactionRequest | NoOp:
    """The KV rule on its own (``_kv_capacity``); ``models``: each workload's model (by
    workload name) as committed beside the policy."""
    return _kv_capacity(RuleContext(policy, snapshot, settings, state, models))
