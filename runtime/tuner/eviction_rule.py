"""The eviction-storm rule: sustained flex evictions above the alert limit.

Only scheduler preemption has a pool.yaml lever, and its answer is always that flex give GPUs
back earlier: the production reserve first, then the shed threshold; other causes are
no-ops naming the cause for a person (docs/tuner.md "Eviction storm: which lever").
"""

from __future__ import annotations

import runtime.tuner.rule_text as rule_text
from runtime.metrics import catalogue, evictions
from runtime.tuner.levers import (
    PROD_RESERVE,
    SHED_THRESHOLD,
    lever_proposal,
    shed_threshold_floor,
    valid_step,
)
from runtime.tuner.proposals import Evidence, NoOp, Proposal
from runtime.tuner.rule_context import MissingWindow, RuleContext, noop_for, sustained
from runtime.tuner.snapshot import Unusable, Window

EVICTION_STORM = "eviction-storm"
"""The rule's name: its proposals' and no-ops' ``rule``, the metrics' label, the branch prefix."""

REASON_LABEL = "reason"
"""Label of ``gpupool:flex_evictions:per_minute`` naming the canonical reason."""


def judge_eviction_storm(cx: RuleContext) -> Proposal | NoOp:
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
    except MissingWindow as missing:
        return noop_for(EVICTION_STORM, missing, "cannot judge evictions")
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
        sustained(total, lambda v: v > limit, f"> {limit}/min"),
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
       ``shed_while_production_above`` one step, never below ``shed_threshold_floor``.
    3. Otherwise a no-op naming the bounds reached, for a person.

    Every lever here keeps less flex, so none needs a veto and none waits for
    production-pending data.
    """
    seen, support = _pending_story(cx)
    changes, refusal = valid_step(cx, PROD_RESERVE)
    reserve = cx.policy.prod_pool.reserve_ratio
    if changes:
        text = rule_text.raise_reserve(
            reserve=reserve, after=changes[0].after, limit=cx.eviction_limit, seen=seen
        )
        return lever_proposal(EVICTION_STORM, text, changes, (*evidence, *support), PROD_RESERVE)
    bound = rule_text.reserve_bound(reserve, refusal, cx.settings)
    return _shed_earlier(cx, evidence, support, seen=seen, reserve_bound=bound)


def _pending_story(cx: RuleContext) -> tuple[str, tuple[Evidence, ...]]:
    """What production-pending data says of a preemption storm, and its evidence row (none
    when the window is unusable: the levers here keep less flex and do not need it)."""
    pending = cx.usable(catalogue.PROD_PODS_PENDING)
    if isinstance(pending, Unusable):
        return rule_text.pending_seen(pending, 0.0, cx.persistence), ()
    waited = pending.share(lambda v: v > 0)
    support = (sustained(pending, lambda v: v > 0, "> 0 pending"),)
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
        return noop_for(EVICTION_STORM, MissingWindow(got), what)
    shed = cx.policy.elastic.shed_while_production_above
    grow = cx.policy.elastic.grow_while_production_below
    band = round(shed - cx.settings.ratio_margin, 4)
    near = got.share(lambda v: v >= band)
    if near < cx.persistence:
        reason = rule_text.shed_would_not_matter(
            reserve_bound=reserve_bound, band=band, near=near, persistence=cx.persistence, shed=shed
        )
        return NoOp(EVICTION_STORM, reason)
    changes, refusal = valid_step(cx, SHED_THRESHOLD)
    if not changes:
        reason = rule_text.every_lever_at_its_bound(
            reserve_bound=reserve_bound,
            shed=shed,
            refusal=refusal,
            floor=shed_threshold_floor(cx.policy, cx.settings),
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
    near_band = sustained(got, lambda v: v >= band, rule_text.shed_band(band))
    return lever_proposal(
        EVICTION_STORM, text, changes, (*evidence, near_band, *support), SHED_THRESHOLD
    )
