"""The levers: the only policy fields the tuner moves, one bounded step at a time.

Every policy change is one step of a ``Lever`` (``LEVERS``), each of which changes what the
cluster does (a recording rule, an HPA or a flex Deployment's arguments), not only the
policy's own ConfigMap copy. A step is proposed only if the policy's own invariants accept
it (``apply_changes``, ``valid_step``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import runtime.tuner.rule_text as rule_text
from policy import PolicyError, PoolPolicy, parse_policy
from runtime.tuner.proposals import Change, Evidence, Proposal
from runtime.tuner.rule_context import RuleContext
from runtime.tuner.rule_text import ProposalText
from runtime.tuner.settings import TunerSettings


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
    """``current`` one ``step`` up, at most ``bound``."""
    return round(min(current + step, bound), digits)


def _step_down(current: float, step: float, bound: float, digits: int = 4) -> float:
    """``current`` one ``step`` down, at least ``bound``."""
    return round(max(current - step, bound), digits)


def _prod_reserve_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    """One step UP of the prod pool's reserve: flex gives GPUs back earlier."""
    now = policy.prod_pool.reserve_ratio
    after = _step(now, settings.reserve_ratio_step, settings.reserve_ratio_max)
    path = ("node_pools", policy.node_pools.index(policy.prod_pool), "reserve_ratio")
    return (Change(path, now, after, PROD_RESERVE.name),) if after > now else ()


def shed_threshold_floor(policy: PoolPolicy, settings: TunerSettings) -> float:
    """The lowest ``elastic.shed_while_production_above`` the tuner proposes: the settings'
    ``shed_threshold_min``, and never within ``ratio_margin`` of the grow threshold (the
    band must stay a band: the policy's invariant only asks grow < shed)."""
    grow = policy.elastic.grow_while_production_below
    return round(max(settings.shed_threshold_min, grow + settings.ratio_margin), 4)


def _shed_threshold_step(policy: PoolPolicy, settings: TunerSettings) -> tuple[Change, ...]:
    """One step DOWN: flex sheds at a lower production utilization, i.e. earlier."""
    now = policy.elastic.shed_while_production_above
    floor = shed_threshold_floor(policy, settings)
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
    """One step UP of the GPU memory share the KV cache may take."""
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


def apply_changes(policy: PoolPolicy, changes: Sequence[Change]) -> PoolPolicy:
    """The policy with ``changes`` applied, validated; raises PolicyError on a broken rule."""
    document: Any = policy.model_dump(mode="json", by_alias=True)
    for change in changes:
        node = document
        for part in change.path[:-1]:
            node = node[part]
        node[change.path[-1]] = change.after
    return parse_policy(document, "<proposed policy>")


def valid_step(cx: RuleContext, lever: Lever) -> tuple[tuple[Change, ...], str]:
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


def lever_proposal(
    rule: str,
    text: ProposalText,
    changes: tuple[Change, ...],
    evidence: Sequence[Evidence],
    lever: Lever,
) -> Proposal:
    """The proposal of one lever's step, flagged when the lever adds flex load."""
    return Proposal(
        rule,
        text.title,
        changes,
        text.why,
        text.effect,
        tuple(evidence),
        adds_flex_load=lever.adds_flex_load,
    )
