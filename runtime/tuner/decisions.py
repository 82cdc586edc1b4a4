"""Pure tuning decisions: (policy, metric windows, tuner state, settings) -> proposal or no-op.

Each rule reads only the windows it needs and fails closed: a missing, stale or NaN series
is a reasoned no-op, never a guess. Every condition that leads to a proposal must be
*sustained* (hold in ``settings.persistence`` of its window's samples), never one sample;
the only single-sample tests are vetoes that stop a change adding flex load. One cycle
proposes at most one policy change (safety first: an eviction storm outranks KV capacity,
which outranks more flex replicas), and none inside the cooldown after the last proposal.
Every proposed policy is validated with the policy's own invariants before it is returned.

Every policy change is one step of a ``Lever`` (``LEVERS``): the fields the tuner may move,
each of which changes what the cluster does (a recording rule, an HPA or a flex
Deployment's arguments), not only the policy's own ConfigMap copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy import PolicyError, PoolPolicy, parse_policy
from policy.base import duration_seconds
from policy.workloads import FlexWorkload
from runtime.metrics import catalogue, evictions
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import split
from runtime.tuner.snapshot import MetricsSnapshot, Unusable, Window, check, usable
from runtime.vllm import BackendError, KvPlanError, ModelSpec, plan_kv_cache

PolicyPath = tuple[str | int, ...]
"""Path of a scalar in the policy document, e.g. ``("elastic", "shed_while_production_above")``."""


@dataclass(frozen=True)
class Change:
    """One scalar of the policy, before and after, and the lever that moved it."""

    path: PolicyPath
    before: float
    after: float
    lever: str = ""
    """``Lever.name`` of the step that made this change."""

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
    last_advise_at: float | None = None
    """When the advise lever last finished a sweep (``tuner.advise.every`` counts from it)."""


@dataclass(frozen=True)
class CycleDecision:
    """The outcome of one cycle: at most one proposal, maybe a compaction request, and why."""

    proposal: Proposal | None
    compaction: CompactionRequest | None
    noops: tuple[NoOp, ...] = field(default_factory=tuple)


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


# --- windows --------------------------------------------------------------------------------


class _Missing(Exception):
    def __init__(self, unusable: Unusable) -> None:
        self.unusable = unusable


def _limits(policy: PoolPolicy, settings: TunerSettings) -> tuple[float, float]:
    interval_s = duration_seconds(policy.metrics.evaluation_interval)
    return settings.stale_after_intervals * interval_s, settings.min_observation_s


def _usable(
    policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings, name: str
) -> Window | Unusable:
    stale_after_s, min_observation_s = _limits(policy, settings)
    return usable(snapshot, name, stale_after_s=stale_after_s, min_observation_s=min_observation_s)


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


def _split(
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    settings: TunerSettings,
    name: str,
    by: Sequence[str],
) -> dict[tuple[str, ...], Window]:
    """The usable windows of ``name`` per value tuple of ``by``; unusable splits (an instance
    that started recently, a workload gone stale) are left out."""
    stale_after_s, min_observation_s = _limits(policy, settings)
    out = {}
    for key, window in split(snapshot, name, by).items():
        got = check(
            window,
            window.name,
            at=snapshot.at,
            stale_after_s=stale_after_s,
            min_observation_s=min_observation_s,
        )
        if isinstance(got, Window):
            out[key] = got
    return out


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


# --- eviction storm -------------------------------------------------------------------------

REASON_LABEL = "reason"
"""Label of ``gpupool:flex_evictions:per_minute`` naming the canonical reason."""


def _dominant_reason(
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    settings: TunerSettings,
    total: Window,
    limit: float,
) -> tuple[str, float, Window] | None:
    """The reason with the most evictions in most of the storm's samples (one vote per sample
    above the limit, so a burst of another reason in one sample cannot steer the lever), the
    share of storm samples it led, and its window. Ties go to ``evictions.PRECEDENCE``."""
    by_reason = {
        key[0]: window
        for key, window in _split(
            policy, snapshot, settings, catalogue.FLEX_EVICTIONS, (REASON_LABEL,)
        ).items()
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


def _cause_for_a_person(policy: PoolPolicy, reason: str, led: float, limit: float) -> str:
    """Why an eviction storm of ``reason`` has no pool.yaml lever, and where a person looks
    (the same remedies as docs/runbooks.md, FlexEvictionRateHigh)."""
    shown = repr(reason) if reason else "(no reason label)"
    head = (
        f"sustained flex evictions above {limit}/min, mostly {shown} (the top reason in "
        f"{led:.0%} of the storm's samples)"
    )
    tail = "no pool.yaml threshold changes that, so the tuner proposes nothing; a person must look"
    if reason == evictions.EVICTION_API:
        pools = "; ".join(
            f"node_pools[{p.name}].karpenter: consolidation_policy "
            f"{p.karpenter.consolidation_policy}, consolidate_after "
            f"{p.karpenter.consolidate_after}, disruption_budget_nodes "
            f"{p.karpenter.disruption_budget_nodes}, capacity_types "
            f"{list(p.karpenter.capacity_types)}"
            for p in policy.flex_pools
        )
        hint = ""
        if any(p.karpenter.consolidation_policy != "WhenEmpty" for p in policy.flex_pools):
            hint = (
                " WhenEmptyOrUnderutilized lets Karpenter move running flex pods: WhenEmpty "
                "never does."
            )
        return (
            f"{head}: the Eviction API (kubectl drain or upgrades, Karpenter consolidation, "
            "drift or spot interruption; PodDisruptionBudgets apply, "
            f"disruption.pdb_min_available {policy.disruption.pdb_min_available}). Find which "
            "in Karpenter's events and karpenter_nodeclaims_disrupted_total by reason; "
            f"{pools} (rendered for the karpenter target only).{hint} {tail}"
        )
    if reason == evictions.KUBELET:
        memory = ", ".join(f"{w.name} {w.resources.memory}" for w in policy.workloads)
        return (
            f"{head}: the kubelet evicted pods for node pressure (memory, disk, PIDs) or a "
            "graceful node shutdown. Check the flex nodes' conditions and eviction events "
            "(kubectl describe node), the flex containers' memory against their real use "
            f"(workloads[].resources.memory: {memory or 'none'}; the KV offload's host "
            f"memory, kv_cache.offload_host_gib {policy.kv_cache.offload_host_gib}, counts "
            f"against the pod) and ephemeral storage; {tail}"
        )
    if reason == evictions.NODE:
        return (
            f"{head}: node failures (pods deleted off NotReady or unreachable nodes by the "
            "taint manager, lost or shut-down nodes). Check the flex nodes' health and the "
            f"cloud provider's events; {tail}"
        )
    return (
        f"{head}: a reason without a canonical mapping (NodeAffinity, "
        "UnexpectedAdmissionError or one added to metrics.eviction_reasons / "
        "disruption_reasons); kube_pod_status_reason and kube_pod_status_disruption_reason "
        f"of the flex pods name it; {tail}"
    )


def eviction_storm(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """Sustained flex evictions above the alert limit: one bounded step of the lever the
    dominant reason calls for (docs/tuner.md "Eviction storm: which lever").

    Only scheduler preemption has a pool.yaml lever, and its answer is always that flex give
    GPUs back EARLIER (shedding is not counted as an eviction; shedding later means more
    preemption): raise the production reserve; with the reserve at its bound and
    production's utilization persistently at or near the shed threshold, lower
    ``shed_while_production_above``; otherwise a no-op naming the bounds. Eviction-API,
    kubelet and node-failure storms are no-ops naming the cause for a person.
    """
    rule = "eviction-storm"
    limit = policy.alerting.thresholds.flex_eviction_rate.per_minute_max
    try:
        (total,) = _windows(policy, snapshot, settings, [catalogue.FLEX_EVICTIONS])
    except _Missing as missing:
        return _noop_for(rule, missing, "cannot judge evictions")
    above = total.share(lambda v: v > limit)
    if above < settings.persistence:
        return NoOp(
            rule,
            f"evictions above {limit}/min in {above:.0%} of samples, "
            f"below the {settings.persistence:.0%} needed to call it sustained",
        )
    evidence = [_sustained(total, lambda v: v > limit, f"> {limit}/min")]
    dominant = _dominant_reason(policy, snapshot, settings, total, limit)
    if dominant is None:
        return NoOp(
            rule,
            f"sustained evictions, but {catalogue.FLEX_EVICTIONS} has no usable per-"
            f"{REASON_LABEL} series: the lever depends on the reason, so none is taken",
        )
    reason, led, window = dominant
    if reason != evictions.PREEMPTION:
        return NoOp(rule, _cause_for_a_person(policy, reason, led, limit))
    evidence.append(
        Evidence(
            window.name, f"the top reason in {led:.0%} of the storm's samples", window.summary()
        )
    )
    return _preemption_storm(policy, snapshot, settings, evidence, limit)


def _valid_step(
    policy: PoolPolicy, lever: Lever, settings: TunerSettings
) -> tuple[tuple[Change, ...], str]:
    """The lever's next step if the policy's own invariants accept it, else no change and
    why not ("" when the lever is at the tuner's bound)."""
    changes = lever.steps(policy, settings)
    if not changes:
        return (), ""
    try:
        apply_changes(policy, changes)
    except PolicyError as exc:
        return (), f"the policy refuses {changes[0].dotted} {changes[0].after:g}: {exc}"
    return changes, ""


def _preemption_storm(
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    settings: TunerSettings,
    evidence: list[Evidence],
    limit: float,
) -> Proposal | NoOp:
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
    rule = "eviction-storm"
    persistence = settings.persistence
    reserve = policy.prod_pool.reserve_ratio
    got_pending = _usable(policy, snapshot, settings, catalogue.PROD_PODS_PENDING)
    support: tuple[Evidence, ...] = ()
    if isinstance(got_pending, Window):
        waited = got_pending.share(lambda v: v > 0)
        support = (_sustained(got_pending, lambda v: v > 0, "> 0 pending"),)
        if waited >= persistence:
            seen = (
                f"production pods were also pending in {waited:.0%} of the samples: production "
                "bursts collide with flex"
            )
        else:
            seen = (
                f"production pods were pending in {waited:.0%} of the samples; a preemptor is "
                "placed within seconds, so a sample rarely sees it wait"
            )
    else:
        seen = (
            f"production-pending data is unusable ({got_pending.reason}); this lever keeps "
            "less flex, so it does not need it"
        )

    changes, refused = _valid_step(policy, PROD_RESERVE, settings)
    if changes:
        after = changes[0].after
        return Proposal(
            rule,
            f"Raise the production reserve to {after:g} (flex preempted above {limit}/min)",
            changes,
            "The scheduler preempted flex pods persistently: each preemption is production "
            f"taking GPUs flex held, and {seen}. The budget rule sheds flex whenever the "
            "unallocated GPUs fall under every pool's reserve, ahead of production; a larger "
            "production reserve makes flex give GPUs back earlier, so production finds them "
            "free instead of preempting. (Shedding later, with a higher "
            "shed_while_production_above or a longer HPA scale-down window, would keep flex "
            "on those GPUs longer: more preemption.)",
            f"Fewer flex preemptions; flex loses up to {after - reserve:.0%} of the production "
            "pool as usable headroom.",
            (*evidence, *support),
            adds_flex_load=PROD_RESERVE.adds_flex_load,
        )
    reserve_bound = (
        f"reserve_ratio {reserve:g} cannot rise: {refused}"
        if refused
        else f"reserve_ratio {reserve:g} is at its bound (reserve_ratio_max "
        f"{settings.reserve_ratio_max:g})"
    )
    person = (
        "run fewer flex replicas (workloads[].max_replicas) where production bursts, or give "
        "production more nodes; a person must look"
    )
    got_utilization = _usable(policy, snapshot, settings, catalogue.PRODUCTION_GPU_UTILIZATION)
    if isinstance(got_utilization, Unusable):
        return _noop_for(
            rule,
            _Missing(got_utilization),
            f"sustained flex preemption, but {reserve_bound} and the shed threshold is only "
            "lowered on production utilization that persisted; " + person,
        )
    utilization = got_utilization
    shed = policy.elastic.shed_while_production_above
    band = round(shed - settings.ratio_margin, 4)
    near = utilization.share(lambda v: v >= band)
    if near < persistence:
        return NoOp(
            rule,
            f"sustained flex preemption, but {reserve_bound}, and production utilization "
            f"reached shed_while_production_above - margin ({band:g}) in {near:.0%} of "
            f"samples, below the {persistence:.0%} that would make lowering the shed "
            f"threshold ({shed:g}) matter; " + person,
        )
    changes, refused = _valid_step(policy, SHED_THRESHOLD, settings)
    if not changes:
        floor = _shed_threshold_floor(policy, settings)
        grow = policy.elastic.grow_while_production_below
        shed_bound = (
            f"shed_while_production_above {shed:g} cannot fall: {refused}"
            if refused
            else f"shed_while_production_above {shed:g} is at its bound {floor:g} (the higher "
            f"of shed_threshold_min {settings.shed_threshold_min:g} and "
            f"grow_while_production_below {grow:g} + ratio_margin {settings.ratio_margin:g})"
        )
        return NoOp(
            rule,
            "sustained flex preemption with production utilization near the shed threshold, "
            f"but every lever is at its bound: {reserve_bound}; {shed_bound}; " + person,
        )
    after = changes[0].after
    grow = policy.elastic.grow_while_production_below
    return Proposal(
        rule,
        f"Lower elastic.shed_while_production_above to {after:g} "
        f"(flex preempted above {limit}/min)",
        changes,
        f"The scheduler preempted flex pods persistently and {reserve_bound}. Production's "
        f"GPU utilization stayed at or above the shed threshold less the margin ({band:g}) "
        f"in {near:.0%} of the samples: flex kept its GPUs until production crossed "
        f"{shed:g}, and production took them by preemption first. Lowering the threshold "
        f"makes flex shed one HPA step from {after:g}, ahead of production ({seen}). The band "
        f"stays {grow:g}-{after:g}.",
        f"Fewer flex preemptions; flex sheds while production keeps more than {after:g} "
        f"(not {shed:g}) of the pools' GPUs busy.",
        (
            *evidence,
            _sustained(utilization, lambda v: v >= band, f">= shed threshold - margin ({band:g})"),
            *support,
        ),
        adds_flex_load=SHED_THRESHOLD.adds_flex_load,
    )


# --- idle production with queued flex demand ------------------------------------------------


def idle_flex_demand(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """Production persistently below the grow threshold while flex requests queue and the
    HPA runs at its bound: widen the bounds of the workloads at their bound, within their
    flex pools' GPU capacity.

    It adds flex load, so it needs fresh proof of all six series: production utilization,
    queue, idle flex GPUs to grow into (headroom), no pending production pod and no eviction
    storm (both single-sample vetoes), and the HPA at maxReplicas (per workload).
    """
    rule = "idle-flex-demand"
    try:
        utilization, queue, headroom, pending, flex_evictions, _at_max = _windows(
            policy,
            snapshot,
            settings,
            [
                catalogue.PRODUCTION_GPU_UTILIZATION,
                catalogue.VLLM_QUEUE_DEPTH,
                catalogue.FLEX_HEADROOM_GPUS,
                catalogue.PROD_PODS_PENDING,
                catalogue.FLEX_EVICTIONS,
                catalogue.FLEX_HPA_AT_MAX,
            ],
        )
    except _Missing as missing:
        return _noop_for(rule, missing, "no change that adds flex load")
    persistence = settings.persistence
    below = round(policy.elastic.grow_while_production_below - settings.ratio_margin, 4)
    idle = utilization.share(lambda v: v < below)
    queued = queue.share(lambda v: v > 0)
    limit = policy.alerting.thresholds.flex_eviction_rate.per_minute_max
    if idle < persistence or queued < persistence:
        return NoOp(
            rule,
            f"production utilization below {below:g} in {idle:.0%} and flex requests queued "
            f"in {queued:.0%} of samples; both must reach {persistence:.0%}",
        )
    # Vetoes (one sample suffices): more flex must never meet waiting production or a storm.
    if max(pending.values) > 0 or max(flex_evictions.values) > limit:
        return NoOp(
            rule,
            "production looks idle but production pods were pending or flex evictions "
            f"exceeded {limit}/min in at least one sample (a veto): no more flex",
        )
    if headroom.share(lambda v: v > 0) < persistence:
        return NoOp(
            rule,
            "flex requests queue but the flex pools had no idle GPUs (flex_headroom_gpus) "
            "to grow into; more replicas would stay pending",
        )
    steps = FLEX_MAX_REPLICAS.steps(policy, settings)
    if not steps:
        return NoOp(
            rule,
            "flex demand is queued but every workload's max_replicas is auto or already "
            "fills the GPUs of its pools; add flex nodes (node_pools.*.max_nodes) or lend a "
            "prod pool (node_pools.*.lend_idle)",
        )
    queues = _split(
        policy, snapshot, settings, catalogue.VLLM_QUEUE_DEPTH, (policy.metrics.workload_label,)
    )
    bounds = _split(
        policy, snapshot, settings, catalogue.FLEX_HPA_AT_MAX, (catalogue.BUDGET_LABEL,)
    )
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
            skipped.append(f"{workload.name} (HPA at maxReplicas in {share:.0%}, queued: {demand})")
    if not changes:
        return NoOp(
            rule,
            "flex requests queue, but no workload both ran its HPA at maxReplicas and queued "
            f"requests in {persistence:.0%} of samples ({catalogue.FLEX_HPA_AT_MAX}): "
            f"max_replicas is not what caps them; {', '.join(skipped)}",
        )
    added = sum(int(c.after - c.before) for c in changes)
    return Proposal(
        rule,
        "Widen flex replica bounds (idle production, queued flex requests, HPA at its bound)",
        tuple(changes),
        f"Production's GPU utilization stayed below grow_while_production_below - margin "
        f"({below:g}) while flex requests queued and the HPA ran at maxReplicas, no "
        "production pod waited and evictions stayed within the limit: the HPA is capped by "
        "max_replicas, not by the cluster."
        + (f" Not widened: {', '.join(skipped)}." if skipped else ""),
        f"The HPA may add up to {added} more flex replicas; the queue drains.",
        (
            _sustained(utilization, lambda v: v < below, f"< {below:g}"),
            _sustained(queue, lambda v: v > 0, "> 0 queued"),
            _sustained(headroom, lambda v: v > 0, "> 0 idle flex GPUs"),
            _sustained(pending, lambda v: v == 0, "no production pending"),
            _sustained(flex_evictions, lambda v: v <= limit, f"<= {limit}/min"),
            *per_workload,
        ),
        adds_flex_load=FLEX_MAX_REPLICAS.adds_flex_load,
    )


# --- KV capacity, per instance --------------------------------------------------------------


def _kv_bytes(
    policy: PoolPolicy, workload: FlexWorkload, models: Mapping[str, ModelSpec]
) -> int | str:
    """The workload's ``--kv-cache-memory-bytes`` under ``policy``, or why it cannot be sized."""
    model = models.get(workload.name)
    if model is None:
        return f"{workload.name}: no model config ({workload.hf_config}) to size its KV cache"
    try:
        return plan_kv_cache(policy, workload, model).kv_cache_bytes
    except (KvPlanError, BackendError) as exc:
        return f"{workload.name}: {exc}"


def kv_capacity(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
) -> Proposal | CompactionRequest | NoOp:
    """Hit rate below the alert floor, judged per vLLM instance (``metrics.instance_labels``)
    on its own windows: more KV capacity if one instance is persistently low-hit AND
    persistently full, and only when that moves some workload's ``--kv-cache-memory-bytes``;
    compaction if one is low-hit and sparse; nothing otherwise (one instance's low hit rate
    never pairs with another's full cache).

    ``models``: each workload's model (by workload name) as committed beside the policy.
    """
    rule = "kv-hit-rate"
    try:
        _windows(
            policy, snapshot, settings, [catalogue.KV_CACHE_HIT_RATE, catalogue.KV_CACHE_USAGE]
        )
    except _Missing as missing:
        return _noop_for(rule, missing, "no KV change")
    by = tuple(policy.metrics.instance_labels)
    hits = _split(policy, snapshot, settings, catalogue.KV_CACHE_HIT_RATE, by)
    usages = _split(policy, snapshot, settings, catalogue.KV_CACHE_USAGE, by)
    kv, persistence = policy.kv_cache, settings.persistence
    floor = round(policy.alerting.thresholds.kv_hit_rate.min - settings.ratio_margin, 4)
    full_at, sparse_below = kv.page_table_max_usage, kv.compaction_usage_below
    low_hit = [k for k, w in hits.items() if w.share(lambda v: v < floor) >= persistence]
    if not low_hit:
        return NoOp(
            rule,
            f"no vLLM instance had its hit rate below {floor:g} in {persistence:.0%} of its "
            f"samples ({len(hits)} instances judged)",
        )
    full = [
        k for k in low_hit if k in usages and usages[k].share(lambda v: v >= full_at) >= persistence
    ]
    sparse = [
        k
        for k in low_hit
        if k in usages and usages[k].share(lambda v: v < sparse_below) >= persistence
    ]

    def evidence(
        keys: list[tuple[str, ...]], test: Callable[[float], bool], cond: str
    ) -> tuple[Evidence, ...]:
        out = []
        for key in keys:
            out.append(_sustained(hits[key], lambda v: v < floor, f"< {floor:g}"))
            out.append(_sustained(usages[key], test, cond))
        return tuple(out)

    if full:
        return _kv_share(
            policy,
            settings,
            models,
            full,
            evidence(full, lambda v: v >= full_at, f">= {full_at:g}"),
        )
    if sparse:
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
            f"({sparse_below:g}) on the same instance ({len(sparse)} of {len(hits)}): the cache "
            "is sparse, not short; compact instead of adding capacity",
            evidence(sparse, lambda v: v < sparse_below, f"< {sparse_below:g}"),
        )
    return NoOp(
        rule,
        f"{len(low_hit)} instance(s) had a low hit rate, but none of them was also full "
        f"(>= {full_at:g}) or sparse (< {sparse_below:g}) in {persistence:.0%} of its own "
        "samples",
    )


def _kv_share(
    policy: PoolPolicy,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
    instances: list[tuple[str, ...]],
    evidence: tuple[Evidence, ...],
) -> Proposal | NoOp:
    rule = "kv-hit-rate"
    kv = policy.kv_cache
    floor = round(policy.alerting.thresholds.kv_hit_rate.min - settings.ratio_margin, 4)
    changes = KV_SHARE.steps(policy, settings)
    if not changes:
        return NoOp(
            rule,
            f"an instance is low-hit and full but max_gpu_memory_share is at the tuner's bound "
            f"{settings.kv_share_max:g}",
        )
    after_share = changes[0].after
    try:
        proposed = apply_changes(policy, changes)
    except PolicyError as exc:
        return NoOp(rule, f"proposed policy is invalid, not proposed: {exc}")
    labels = policy.metrics.instance_labels
    names = (
        {key[labels.index(policy.metrics.workload_label)] for key in instances}
        if policy.metrics.workload_label in labels
        else set()
    )
    considered = [w for w in policy.workloads if w.name in names] or list(policy.workloads)
    moved, unmoved = [], []
    for workload in considered:
        before, after = _kv_bytes(policy, workload, models), _kv_bytes(proposed, workload, models)
        if isinstance(before, str) or isinstance(after, str):
            unmoved.append(before if isinstance(before, str) else str(after))
        elif after != before:
            moved.append(
                f"{workload.name} {before:,} -> {after:,} bytes ({after / before - 1:+.1%})"
            )
        else:
            unmoved.append(
                f"{workload.name} stays at {before:,} bytes (weights, not the share, bound it)"
            )
    if not moved:
        return NoOp(
            rule,
            f"an instance is low-hit and full, but raising kv_cache.max_gpu_memory_share to "
            f"{after_share:g} changes no workload's --kv-cache-memory-bytes: {'; '.join(unmoved)}",
        )
    return Proposal(
        rule,
        f"Raise kv_cache.max_gpu_memory_share to {after_share:g} (hit rate below {floor:g})",
        changes,
        f"On {len(instances)} vLLM instance(s) the prefix-cache hit rate stayed low while that "
        f"same instance's KV usage stayed at or above page_table_max_usage "
        f"({kv.page_table_max_usage:g}): cached prefixes are evicted for lack of blocks. More "
        "KV memory keeps them.",
        f"--kv-cache-memory-bytes: {'; '.join(moved)}; a higher hit rate, less burst headroom "
        "in GPU memory.",
        evidence,
        adds_flex_load=KV_SHARE.adds_flex_load,
    )


def decide(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
) -> CycleDecision:
    """Run every rule; keep the first valid proposal by priority, unless in cooldown."""
    outcomes: list[Outcome] = [
        eviction_storm(policy=policy, snapshot=snapshot, settings=settings),
        kv_capacity(
            policy=policy, snapshot=snapshot, state=state, settings=settings, models=models
        ),
        idle_flex_demand(policy=policy, snapshot=snapshot, settings=settings),
    ]
    noops: list[NoOp] = [o for o in outcomes if isinstance(o, NoOp)]
    compaction = next((o for o in outcomes if isinstance(o, CompactionRequest)), None)
    proposal: Proposal | None = None
    levers = {lever.name for lever in LEVERS}
    for candidate in (o for o in outcomes if isinstance(o, Proposal)):
        if proposal is not None:
            noops.append(NoOp(candidate.rule, f"deferred: {proposal.rule} goes first"))
            continue
        if any(c.lever not in levers for c in candidate.changes):
            raise RuntimeError(f"{candidate.rule}: a change that no lever made: {candidate}")
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
