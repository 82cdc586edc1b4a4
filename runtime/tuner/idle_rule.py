"""The idle-flex-demand rule: production idle while flex requests queue at the HPA bound.

It is the one rule that adds flex load, so it needs fresh proof of every series it reads and
single-sample vetoes (pending production, an eviction storm) stop it.
"""

from __future__ import annotations

import runtime.tuner.rule_text as rule_text
from runtime.metrics import catalogue
from runtime.tuner.levers import FLEX_MAX_REPLICAS, lever_proposal
from runtime.tuner.proposals import Change, Evidence, NoOp, Proposal
from runtime.tuner.rule_context import MissingWindow, RuleContext, noop_for, sustained

IDLE_FLEX_DEMAND = "idle-flex-demand"
"""The rule's name: its proposals' and no-ops' ``rule``, the metrics' label, the branch prefix."""

_IDLE_SERIES = (
    catalogue.PRODUCTION_GPU_UTILIZATION,
    catalogue.VLLM_QUEUE_DEPTH,
    catalogue.FLEX_HEADROOM_GPUS,
    catalogue.PROD_PODS_PENDING,
    catalogue.FLEX_EVICTIONS,
    catalogue.FLEX_HPA_AT_MAX,
)
"""The six series ``idle_flex_demand`` needs fresh proof of, in the order it unpacks them."""


def judge_idle_flex_demand(cx: RuleContext) -> Proposal | NoOp:
    """Production persistently below the grow threshold while flex requests queue and the
    HPA runs at its bound: widen the bounds of the workloads at their bound, within their
    flex pools' GPU capacity.

    It adds flex load, so it needs fresh proof of all six series: production utilization,
    queue, idle flex GPUs to grow into (headroom), no pending production pod and no eviction
    storm (both single-sample vetoes), and the HPA at maxReplicas (per workload).
    """
    try:
        utilization, queue, headroom, pending, flex_evictions, _at_max = cx.windows(_IDLE_SERIES)
    except MissingWindow as missing:
        return noop_for(IDLE_FLEX_DEMAND, missing, "no change that adds flex load")
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
        sustained(utilization, lambda v: v < below, f"< {below:g}"),
        sustained(queue, lambda v: v > 0, "> 0 queued"),
        sustained(headroom, lambda v: v > 0, "> 0 idle flex GPUs"),
        sustained(pending, lambda v: v == 0, "no production pending"),
        sustained(flex_evictions, lambda v: v <= limit, f"<= {limit}/min"),
        *per_workload,
    )
    return lever_proposal(IDLE_FLEX_DEMAND, text, changes, evidence, FLEX_MAX_REPLICAS)


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
            per_workload.append(sustained(at_max, lambda v: v >= 1, "HPA at maxReplicas"))
            per_workload.append(sustained(waiting, lambda v: v > 0, "> 0 queued"))
        else:
            share = 0.0 if at_max is None else at_max.share(lambda v: v >= 1)
            skipped.append(rule_text.not_widened(workload.name, share, demand))
    return tuple(changes), per_workload, skipped
