"""The KV-capacity rule: a low prefix-cache hit rate, judged per vLLM instance.

A low-hit instance that is full gets more KV share (only where that moves its workload's
``--kv-cache-memory-bytes``); one that is sparse gets compaction; one instance's low hit
rate never pairs with another's full cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import runtime.tuner.rule_text as rule_text
from policy import PolicyError, PoolPolicy
from policy.base import duration_seconds
from policy.workloads import FlexWorkload
from runtime.metrics import catalogue
from runtime.tuner.levers import KV_SHARE, apply_changes, lever_proposal
from runtime.tuner.proposals import CompactionRequest, Evidence, NoOp, Proposal
from runtime.tuner.rule_context import MissingWindow, RuleContext, noop_for, sustained
from runtime.vllm import BackendError, KvPlanError, ModelSpec, plan_kv_cache

KV_HIT_RATE = "kv-hit-rate"
"""The rule's name: its proposals' and no-ops' ``rule``, the metrics' label, the branch prefix."""

Instance = tuple[str, ...]
"""A vLLM instance: its values of ``metrics.instance_labels``."""


def judge_kv_capacity(cx: RuleContext) -> Proposal | CompactionRequest | NoOp:
    """Hit rate below the alert floor, judged per vLLM instance (``metrics.instance_labels``)
    on its own windows: more KV capacity if one instance is persistently low-hit AND
    persistently full, and only when that moves some workload's ``--kv-cache-memory-bytes``;
    compaction if one is low-hit and sparse; nothing otherwise (one instance's low hit rate
    never pairs with another's full cache)."""
    try:
        cx.windows([catalogue.KV_CACHE_HIT_RATE, catalogue.KV_CACHE_USAGE])
    except MissingWindow as missing:
        return noop_for(KV_HIT_RATE, missing, "no KV change")
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
            out.append(sustained(hits[key], lambda v: v < floor, f"< {floor:g}"))
            out.append(sustained(usages[key], test, cond))
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
    return lever_proposal(KV_HIT_RATE, text, changes, evidence, KV_SHARE)


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
