"""Pure tuning decisions: (policy, metric windows, tuner state, settings) -> proposal or no-op.

Each rule reads only the windows it needs and fails closed: a missing, stale or NaN series
is a reasoned no-op, never a guess. Every condition that leads to a proposal must be
*sustained* (hold in ``settings.persistence`` of its window's samples), never one sample;
the only single-sample tests are vetoes that stop a change adding flex load. One cycle
proposes at most one policy change (safety first: an eviction storm outranks KV capacity,
which outranks more flex replicas), and none inside the cooldown after the last proposal.
Every proposed policy is validated with the policy's own invariants before it is returned.

Every rule takes one ``RuleContext`` (``rule_context``) and runs as phases of its own
(gather the windows, check persistence, vetoes, choose the lever, build the outcome), one
module per rule (``eviction_rule``, ``kv_rule``, ``idle_rule``); every policy change is one
step of a ``levers`` lever; the words of every outcome are ``rule_text``'s
(docs/design/tuner-rules.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import runtime.tuner.rule_text as rule_text
from policy import PolicyError, PoolPolicy
from runtime.tuner.eviction_rule import judge_eviction_storm
from runtime.tuner.idle_rule import judge_idle_flex_demand
from runtime.tuner.kv_rule import judge_kv_capacity
from runtime.tuner.levers import LEVERS, apply_changes
from runtime.tuner.proposals import (
    CompactionRequest,
    CycleDecision,
    NoOp,
    Outcome,
    Proposal,
    TunerState,
)
from runtime.tuner.rule_context import RuleContext
from runtime.tuner.settings import TunerSettings
from runtime.tuner.snapshot import MetricsSnapshot
from runtime.vllm import ModelSpec

Rule = Callable[[RuleContext], Outcome]

RULES: tuple[Rule, ...] = (judge_eviction_storm, judge_kv_capacity, judge_idle_flex_demand)
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
    """The eviction-storm rule on its own (``judge_eviction_storm``)."""
    return judge_eviction_storm(RuleContext(policy, snapshot, settings))


def idle_flex_demand(
    *, policy: PoolPolicy, snapshot: MetricsSnapshot, settings: TunerSettings
) -> Proposal | NoOp:
    """The idle-flex-demand rule on its own (``judge_idle_flex_demand``)."""
    return judge_idle_flex_demand(RuleContext(policy, snapshot, settings))


def kv_capacity(
    *,
    policy: PoolPolicy,
    snapshot: MetricsSnapshot,
    state: TunerState,
    settings: TunerSettings,
    models: Mapping[str, ModelSpec],
) -> Proposal | CompactionRequest | NoOp:
    """The KV rule on its own (``judge_kv_capacity``); ``models``: each workload's model (by
    workload name) as committed beside the policy."""
    return judge_kv_capacity(RuleContext(policy, snapshot, settings, state, models))
