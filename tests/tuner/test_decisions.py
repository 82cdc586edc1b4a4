"""Pure decisions on hand-built windows: levers, reasons, per-instance KV, persistence,
bounds, hysteresis, cooldown, fail closed."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from policy import DEFAULT_POLICY, PoolPolicy, load_policy, parse_policy
from runtime.metrics import catalogue as c
from runtime.metrics import evictions as ev
from runtime.tuner.decisions import decide, eviction_storm, idle_flex_demand, kv_capacity
from runtime.tuner.levers import (
    FLEX_MAX_REPLICAS,
    KV_SHARE,
    PROD_RESERVE,
    SHED_THRESHOLD,
    apply_changes,
)
from runtime.tuner.proposals import CompactionRequest, CycleDecision, NoOp, Proposal, TunerState
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import Combine, combine, snapshot_of, split
from runtime.tuner.snapshot import Labels, MetricsSnapshot, Series
from runtime.vllm import ModelSpec, load_model_spec

AT = 1_000_000.0
SETTINGS = TunerSettings()
SHIPPED = load_policy(DEFAULT_POLICY)
POLICY = SHIPPED.model_copy(
    update={"workloads": [SHIPPED.workloads[0].model_copy(update={"max_replicas": 8})]}
)
"""The shipped policy with an explicit flex bound, the one the widening lever steps
(``max_replicas: auto`` is at what the pools hold already)."""
MODELS: dict[str, ModelSpec] = {
    w.name: load_model_spec(DEFAULT_POLICY.parent / w.hf_config) for w in POLICY.workloads
}
FLEX = ("namespace", "gpupool-flex")
WORKLOAD = ("workload", "llama-8b-flex")

Values = float | list[float]
Spec = Values | Mapping[Labels, Values]


def reasons(**per_reason: Values) -> dict[Labels, Values]:
    """The eviction series by canonical reason (every reason present, 0 unless given)."""
    return {(FLEX, ("reason", r)): per_reason.get(r.replace("-", "_"), 0.0) for r in ev.PRECEDENCE}


def instance(pod: str, workload: str = "llama-8b-flex") -> Labels:
    return (FLEX, ("pod", pod), ("workload", workload))


QUIET: dict[str, Spec] = {
    c.PRODUCTION_GPU_UTILIZATION: 0.5,
    c.FLEX_EVICTIONS: reasons(),
    c.PROD_PODS_PENDING: 0.0,
    c.VLLM_QUEUE_DEPTH: {(FLEX, WORKLOAD): 0.0},
    c.FLEX_HEADROOM_GPUS: {(("pool", "gpu-flex"),): 4.0},
    c.FLEX_HPA_AT_MAX: {(FLEX, WORKLOAD): 0.0},
    c.KV_CACHE_USAGE: {instance("a"): 0.6},
    c.KV_CACHE_HIT_RATE: {instance("a"): 0.95},
}
IDLE: dict[str, Spec] = {
    c.PRODUCTION_GPU_UTILIZATION: 0.1,
    c.VLLM_QUEUE_DEPTH: {(FLEX, WORKLOAD): 5.0},
    c.FLEX_HPA_AT_MAX: {(FLEX, WORKLOAD): 1.0},
}
"""Idle production, queued flex demand, the HPA at maxReplicas: widen."""
PREEMPTED = reasons(preemption=9.0)


def once(value: float, rest: float, n: int = 61, at: int = 30) -> list[float]:
    """``rest`` in every sample but one (index ``at``), which is ``value``."""
    return [value if i == at else rest for i in range(n)]


def snap(
    overrides: Mapping[str, Spec] | None = None,
    *,
    span_s: float = 1800,
    drop: tuple[str, ...] = (),
    age_s: float = 0,
) -> MetricsSnapshot:
    """Every series sampled each 30 s over ``span_s`` ending ``age_s`` before AT; a value is
    a constant, a list (one per sample) or a mapping of label sets to either."""
    values = {**QUIET, **(overrides or {})}
    times = [AT - age_s - span_s + 30 * i for i in range(int(span_s // 30) + 1)]

    def samples(v: Values) -> tuple[tuple[float, float], ...]:
        line = v if isinstance(v, list) else [v] * len(times)
        return tuple(zip(times, line, strict=True))

    read = {
        name: [
            Series(labels, samples(v))
            for labels, v in (spec.items() if isinstance(spec, Mapping) else [((), spec)])
        ]
        for name, spec in values.items()
        if name not in drop
    }
    return snapshot_of(AT, read)


def storm(
    extra: Mapping[str, Spec] | None = None, settings: TunerSettings = SETTINGS
) -> Proposal | NoOp:
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED, **(extra or {})})
    return eviction_storm(policy=POLICY, snapshot=snapshot, settings=settings)


def kv(
    overrides: Mapping[str, Spec],
    *,
    policy: PoolPolicy = POLICY,
    state: TunerState | None = None,
    models: Mapping[str, ModelSpec] = MODELS,
) -> Proposal | CompactionRequest | NoOp:
    return kv_capacity(
        policy=policy,
        snapshot=snap(overrides),
        state=state or TunerState(),
        settings=SETTINGS,
        models=models,
    )


def run(
    snapshot: MetricsSnapshot, state: TunerState | None = None, settings: TunerSettings = SETTINGS
) -> CycleDecision:
    return decide(
        policy=POLICY,
        snapshot=snapshot,
        state=state or TunerState(),
        settings=settings,
        models=MODELS,
    )


def changes(out: object) -> list[tuple[tuple[str | int, ...], float]]:
    assert isinstance(out, Proposal), out
    return [(ch.path, ch.after) for ch in out.changes]


def test_quiet_cluster_is_all_noops() -> None:
    d = run(snap())
    assert d.proposal is None and d.compaction is None
    assert all(n.fail_closed is None for n in d.noops), d.noops


# --- eviction storm: the lever follows the reason ------------------------------------------


RESERVE_UP = [(("node_pools", 0, "reserve_ratio"), 0.25)]
SHED_DOWN = [(("elastic", "shed_while_production_above"), 0.6)]
AT_BOUND = TunerSettings(reserve_ratio_max=0.2)
"""The shipped reserve (0.2) is already at the tuner's bound."""
NEAR_SHED = 0.64
"""Production utilization in the band just below the shipped shed threshold (0.65 - 0.02)."""


@pytest.mark.parametrize("pending", [1.0, 0.0, once(1.0, 0.0)], ids=["pending", "none", "once"])
def test_sustained_preemption_raises_the_reserve_with_or_without_pending(pending: Values) -> None:
    """A preemption IS production taking flex's GPUs: pending production only supports it."""
    out = storm({c.PROD_PODS_PENDING: pending})
    assert isinstance(out, Proposal) and not out.adds_flex_load
    [change] = out.changes
    assert (change.path, change.before, change.after) == (
        ("node_pools", 0, "reserve_ratio"),
        0.2,
        0.25,
    )
    assert change.lever == PROD_RESERVE.name
    assert any('reason="preemption"' in e.series for e in out.evidence)
    [waiting] = [e for e in out.evidence if e.series == c.PROD_PODS_PENDING]  # kept as evidence
    share = "100%" if pending == 1.0 else "2%" if isinstance(pending, list) else "0%"
    assert waiting.condition == f"> 0 pending in {share} of samples"
    assert ("also pending in 100%" in out.rationale) == (pending == 1.0)


def test_preemption_raises_the_reserve_even_with_production_running_hot() -> None:
    """Never the shed threshold while the reserve can still rise, and never raised."""
    out = storm({c.PRODUCTION_GPU_UTILIZATION: 0.7})
    assert changes(out) == RESERVE_UP


def test_preemption_with_unusable_pending_data_still_raises_the_reserve() -> None:
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED}, drop=(c.PROD_PODS_PENDING,))
    out = eviction_storm(policy=POLICY, snapshot=snapshot, settings=SETTINGS)
    assert changes(out) == RESERVE_UP
    assert isinstance(out, Proposal) and "production-pending data is unusable" in out.rationale


def test_reserve_steps_are_bounded() -> None:
    out = storm({c.PROD_PODS_PENDING: 1.0}, settings=TunerSettings(reserve_ratio_max=0.22))
    assert isinstance(out, Proposal) and out.changes[0].after == 0.22


@pytest.mark.parametrize("pending", [0.0, 1.0], ids=["none", "pending"])
def test_reserve_at_its_bound_and_production_near_the_shed_threshold_lowers_it(
    pending: float,
) -> None:
    out = storm(
        {c.PRODUCTION_GPU_UTILIZATION: NEAR_SHED, c.PROD_PODS_PENDING: pending}, settings=AT_BOUND
    )
    assert changes(out) == SHED_DOWN  # 0.65 -> 0.6: flex sheds EARLIER
    assert isinstance(out, Proposal) and not out.adds_flex_load
    assert out.changes[0].lever == SHED_THRESHOLD.name
    assert out.changes[0].after < out.changes[0].before
    assert "reserve_ratio 0.2 is at its bound" in out.rationale
    assert any(
        e.series == c.PRODUCTION_GPU_UTILIZATION and "in 100% of samples" in e.condition
        for e in out.evidence
    )


def test_production_above_the_shed_threshold_also_lowers_it() -> None:
    out = storm({c.PRODUCTION_GPU_UTILIZATION: 0.7}, settings=AT_BOUND)
    assert changes(out) == SHED_DOWN


def test_reserve_refused_by_the_policys_invariants_counts_as_its_bound() -> None:
    """Production's floor (38 one-GPU replicas) fits outside a 0.4 reserve of gpu-prod's 64
    GPUs (39 left) but not outside 0.45 (36 left): from 0.4 the next lever is the shed
    threshold, not an invalid reserve."""
    document = POLICY.model_dump(mode="json", by_alias=True)
    document["node_pools"][0]["reserve_ratio"] = 0.4
    document["production"][0].update(gpus_per_replica=1, min_replicas=38, max_replicas=40)
    reserved = parse_policy(document)
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED, c.PRODUCTION_GPU_UTILIZATION: NEAR_SHED})
    out = eviction_storm(policy=reserved, snapshot=snapshot, settings=SETTINGS)
    assert changes(out) == SHED_DOWN
    assert isinstance(out, Proposal) and "the policy refuses" in out.rationale
    assert "outside its reserve" in out.rationale


def test_a_single_sample_near_the_shed_threshold_does_not_lower_it() -> None:
    out = storm({c.PRODUCTION_GPU_UTILIZATION: once(NEAR_SHED, 0.5)}, settings=AT_BOUND)
    assert isinstance(out, NoOp) and out.fail_closed is None
    assert "in 2% of samples" in out.reason and "a person must look" in out.reason


def test_near_the_shed_threshold_in_most_but_not_enough_samples_is_not_sustained() -> None:
    mostly = [NEAR_SHED if i % 5 else 0.5 for i in range(61)]  # 48 of 61 < 90 %
    out = storm({c.PRODUCTION_GPU_UTILIZATION: mostly}, settings=AT_BOUND)
    assert isinstance(out, NoOp) and "in 79% of samples" in out.reason


def test_hysteresis_margin_keeps_the_shed_threshold_when_production_is_below_the_band() -> None:
    out = storm({c.PRODUCTION_GPU_UTILIZATION: 0.62}, settings=AT_BOUND)  # < 0.65 - 0.02
    assert isinstance(out, NoOp) and "in 0% of samples" in out.reason


def test_unusable_production_utilization_fails_closed_with_the_reserve_at_its_bound() -> None:
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED}, drop=(c.PRODUCTION_GPU_UTILIZATION,))
    out = eviction_storm(policy=POLICY, snapshot=snapshot, settings=AT_BOUND)
    assert isinstance(out, NoOp) and out.fail_closed == "absent"
    assert "reserve_ratio 0.2 is at its bound" in out.reason


def _band(grow: float, shed: float) -> PoolPolicy:
    document = POLICY.model_dump(mode="json", by_alias=True)
    document["elastic"].update(grow_while_production_below=grow, shed_while_production_above=shed)
    return parse_policy(document)


@pytest.mark.parametrize(
    ("policy", "settings", "names"),
    [
        (
            POLICY,
            TunerSettings(reserve_ratio_max=0.2, shed_threshold_min=0.65),
            ["reserve_ratio 0.2 is at its bound (reserve_ratio_max 0.2)", "is at its bound 0.65"],
        ),
        (
            _band(0.55, 0.57),  # at its floor grow + margin = 0.57 (above shed_threshold_min)
            TunerSettings(reserve_ratio_max=0.2, shed_threshold_step=0.1),
            [
                "reserve_ratio 0.2 is at its bound",
                "shed_while_production_above 0.57 is at its bound 0.57",
            ],
        ),
    ],
    ids=["settings-floor", "grow-plus-margin"],
)
def test_every_lever_at_its_bound_is_a_noop_naming_the_bounds(
    policy: PoolPolicy, settings: TunerSettings, names: list[str]
) -> None:
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED, c.PRODUCTION_GPU_UTILIZATION: 0.7})
    out = eviction_storm(policy=policy, snapshot=snapshot, settings=settings)
    assert isinstance(out, NoOp) and out.fail_closed is None
    assert "every lever is at its bound" in out.reason and "a person must look" in out.reason
    assert "max_replicas" in out.reason  # the runbook's remedy left to a person
    for name in names:
        assert name in out.reason


def test_the_shed_threshold_never_falls_below_grow_plus_margin() -> None:
    """A step that would cross the floor stops at it: 0.6 - 0.1 -> 0.57 (0.55 + 0.02)."""
    snapshot = snap({c.FLEX_EVICTIONS: PREEMPTED, c.PRODUCTION_GPU_UTILIZATION: 0.7})
    settings = TunerSettings(reserve_ratio_max=0.2, shed_threshold_step=0.1)
    out = eviction_storm(policy=_band(0.55, 0.6), snapshot=snapshot, settings=settings)
    assert changes(out) == [(("elastic", "shed_while_production_above"), 0.57)]
    apply_changes(_band(0.55, 0.6), out.changes)  # type: ignore[union-attr]


def test_brief_eviction_spike_is_not_sustained() -> None:
    spiky = [9.0 if i % 3 == 0 else 0.0 for i in range(61)]
    out = eviction_storm(
        policy=POLICY,
        snapshot=snap({c.FLEX_EVICTIONS: reasons(preemption=spiky)}),
        settings=SETTINGS,
    )
    assert isinstance(out, NoOp) and "sustained" in out.reason


@pytest.mark.parametrize(
    ("per_reason", "names"),
    [
        ({"eviction_api": 9.0}, ["Eviction API", "Karpenter", "consolidation_policy WhenEmpty"]),
        ({"kubelet": 9.0}, ["kubelet", "memory", "llama-8b-flex 64Gi"]),
        ({"node": 9.0}, ["node failures"]),
        ({"other": 9.0}, ["kube_pod_status_reason"]),
    ],
)
def test_storms_without_a_pool_yaml_lever_name_the_cause(
    per_reason: dict[str, float], names: list[str]
) -> None:
    """Even with production pending and running hot: never a threshold change."""
    pressure = {c.PROD_PODS_PENDING: 1.0, c.PRODUCTION_GPU_UTILIZATION: 0.7}
    out = eviction_storm(
        policy=POLICY,
        snapshot=snap({c.FLEX_EVICTIONS: reasons(**per_reason), **pressure}),
        settings=SETTINGS,
    )
    assert isinstance(out, NoOp) and out.fail_closed is None
    assert "proposes nothing" in out.reason
    for name in names:
        assert name in out.reason


def test_the_lever_follows_the_reason_leading_most_samples_not_one_burst() -> None:
    burst = once(500.0, 1.0)  # one sample of a mass drain, otherwise a trickle
    preempted = reasons(preemption=8.0, eviction_api=burst)
    out = storm({c.FLEX_EVICTIONS: preempted, c.PROD_PODS_PENDING: 1.0})
    assert changes(out) == [(("node_pools", 0, "reserve_ratio"), 0.25)]
    drained = reasons(preemption=2.0, eviction_api=6.0)  # 8/min in all, mostly drains
    out = storm({c.FLEX_EVICTIONS: drained, c.PROD_PODS_PENDING: 1.0})
    assert isinstance(out, NoOp) and "Eviction API" in out.reason


def test_evictions_without_a_reason_label_take_no_lever() -> None:
    out = storm({c.FLEX_EVICTIONS: {(FLEX,): 9.0}, c.PROD_PODS_PENDING: 1.0})
    assert isinstance(out, NoOp) and "no reason label" in out.reason


# --- idle production, queued flex demand, HPA at its bound ----------------------------------


def test_hysteresis_margin_ignores_utilization_at_the_threshold() -> None:
    at_threshold = snap({**IDLE, c.PRODUCTION_GPU_UTILIZATION: 0.34})
    assert isinstance(
        idle_flex_demand(policy=POLICY, snapshot=at_threshold, settings=SETTINGS), NoOp
    )
    clearly_idle = snap({**IDLE, c.PRODUCTION_GPU_UTILIZATION: 0.30})
    out = idle_flex_demand(policy=POLICY, snapshot=clearly_idle, settings=SETTINGS)
    assert changes(out) == [(("workloads", 0, "max_replicas"), 10)]
    assert isinstance(out, Proposal) and out.changes[0].lever == FLEX_MAX_REPLICAS.name


def test_widening_needs_the_hpa_at_its_bound_persistently() -> None:
    below = snap({**IDLE, c.FLEX_HPA_AT_MAX: {(FLEX, WORKLOAD): 0.0}})
    out = idle_flex_demand(policy=POLICY, snapshot=below, settings=SETTINGS)
    assert isinstance(out, NoOp) and c.FLEX_HPA_AT_MAX in out.reason
    blip = snap({**IDLE, c.FLEX_HPA_AT_MAX: {(FLEX, WORKLOAD): once(1.0, 0.0)}})
    assert isinstance(idle_flex_demand(policy=POLICY, snapshot=blip, settings=SETTINGS), NoOp)


def test_only_workloads_at_their_bound_are_widened() -> None:
    document = POLICY.model_dump(mode="json", by_alias=True)
    second = {**document["workloads"][0], "name": "other-flex"}
    document["workloads"].append(second)
    two = parse_policy(document)
    other = (FLEX, ("workload", "other-flex"))
    snapshot = snap(
        {
            **IDLE,
            c.VLLM_QUEUE_DEPTH: {(FLEX, WORKLOAD): 5.0, other: 5.0},
            c.FLEX_HPA_AT_MAX: {(FLEX, WORKLOAD): 0.0, other: 1.0},
        }
    )
    out = idle_flex_demand(policy=two, snapshot=snapshot, settings=SETTINGS)
    assert changes(out) == [(("workloads", 1, "max_replicas"), 10)]
    assert "Not widened: llama-8b-flex" in out.rationale  # type: ignore[union-attr]


def test_production_pending_in_one_sample_vetoes_widening() -> None:
    out = idle_flex_demand(
        policy=POLICY,
        snapshot=snap({**IDLE, c.PROD_PODS_PENDING: once(1.0, 0.0)}),
        settings=SETTINGS,
    )
    assert isinstance(out, NoOp) and "veto" in out.reason


def test_flex_widening_needs_idle_flex_gpus() -> None:
    no_room = snap({**IDLE, c.FLEX_HEADROOM_GPUS: 0.0})
    out = idle_flex_demand(policy=POLICY, snapshot=no_room, settings=SETTINGS)
    assert isinstance(out, NoOp) and "flex_headroom_gpus" in out.reason


def test_flex_widening_stops_at_pool_capacity() -> None:
    """At what its pools hold (gpu-flex and the lending gpu-prod: 96 one-GPU replicas) an
    explicit bound is not widened, and ``auto`` never is."""
    capacity = POLICY.replica_capacity(POLICY.workloads[0])
    assert capacity == 96
    full = POLICY.model_copy(
        update={"workloads": [POLICY.workloads[0].model_copy(update={"max_replicas": capacity})]}
    )
    for policy in (full, SHIPPED):
        out = idle_flex_demand(policy=policy, snapshot=snap(IDLE), settings=SETTINGS)
        assert isinstance(out, NoOp) and "max_nodes" in out.reason
    near = POLICY.model_copy(
        update={"workloads": [POLICY.workloads[0].model_copy(update={"max_replicas": 95})]}
    )
    out = idle_flex_demand(policy=near, snapshot=snap(IDLE), settings=SETTINGS)
    assert changes(out) == [(("workloads", 0, "max_replicas"), 96)]


@pytest.mark.parametrize(
    ("drop", "age_s", "nan", "kind"),
    [
        ((c.VLLM_QUEUE_DEPTH,), 0, False, "absent"),
        ((c.FLEX_HPA_AT_MAX,), 0, False, "absent"),
        ((), 600, False, "stale"),
        ((), 0, True, "nan"),
    ],
)
def test_flex_widening_fails_closed(
    drop: tuple[str, ...], age_s: float, nan: bool, kind: str
) -> None:
    queue: Spec = {(FLEX, WORKLOAD): math.nan if nan else 5.0}
    overrides = {**IDLE, c.VLLM_QUEUE_DEPTH: queue}
    out = idle_flex_demand(
        policy=POLICY, snapshot=snap(overrides, drop=drop, age_s=age_s), settings=SETTINGS
    )
    assert isinstance(out, NoOp) and out.fail_closed == kind


def test_unreachable_prometheus_fails_every_rule_closed() -> None:
    d = run(MetricsSnapshot(at=AT, unreachable="refused"))
    assert d.proposal is None and d.compaction is None
    assert {n.fail_closed for n in d.noops} == {"unreachable"}


def test_short_history_is_not_enough() -> None:
    out = idle_flex_demand(policy=POLICY, snapshot=snap(IDLE, span_s=600), settings=SETTINGS)
    assert isinstance(out, NoOp) and out.fail_closed is None and "not enough history" in out.reason


def test_staleness_follows_the_policy_evaluation_interval() -> None:
    aged = snap(IDLE, age_s=100)  # 3 x 30 s = 90 s: stale
    out = idle_flex_demand(policy=POLICY, snapshot=aged, settings=SETTINGS)
    assert isinstance(out, NoOp) and out.fail_closed == "stale"
    slower = POLICY.model_copy(
        update={"metrics": POLICY.metrics.model_copy(update={"evaluation_interval": "1m"})}
    )
    assert isinstance(idle_flex_demand(policy=slower, snapshot=aged, settings=SETTINGS), Proposal)


# --- KV capacity, per instance --------------------------------------------------------------


def test_low_hit_and_full_on_one_instance_raises_the_kv_share() -> None:
    out = kv(
        {
            c.KV_CACHE_HIT_RATE: {instance("a"): 0.5, instance("b"): 0.95},
            c.KV_CACHE_USAGE: {instance("a"): 0.9, instance("b"): 0.3},
        }
    )
    assert changes(out) == [(("kv_cache", "max_gpu_memory_share"), 0.8)]
    assert isinstance(out, Proposal) and out.changes[0].lever == KV_SHARE.name
    assert "112,742,891,520 -> 120,259,084,288 bytes" in out.expected_effect
    assert {e.series for e in out.evidence} == {
        'gpupool:kv_cache_hit_rate:ratio{namespace="gpupool-flex",workload="llama-8b-flex",pod="a"}',
        'gpupool:kv_cache_usage:ratio{namespace="gpupool-flex",workload="llama-8b-flex",pod="a"}',
    }


def test_low_hit_on_one_instance_and_full_cache_on_another_proposes_nothing() -> None:
    out = kv(
        {
            c.KV_CACHE_HIT_RATE: {instance("a"): 0.5, instance("b"): 0.95},
            c.KV_CACHE_USAGE: {instance("a"): 0.65, instance("b"): 0.9},
        }
    )
    assert isinstance(out, NoOp) and "own" in out.reason


def test_low_hit_on_one_instance_and_sparse_cache_on_another_requests_no_compaction() -> None:
    out = kv(
        {
            c.KV_CACHE_HIT_RATE: {instance("a"): 0.5, instance("b"): 0.95},
            c.KV_CACHE_USAGE: {instance("a"): 0.65, instance("b"): 0.2},
        }
    )
    assert isinstance(out, NoOp)


def test_persistence_is_judged_per_instance() -> None:
    """Each instance low in half the window (alternating): the worst-of line is low in
    every sample, yet no instance is persistently low."""
    a = [0.5 if i % 2 else 0.95 for i in range(61)]
    b = [0.95 if i % 2 else 0.5 for i in range(61)]
    out = kv(
        {
            c.KV_CACHE_HIT_RATE: {instance("a"): a, instance("b"): b},
            c.KV_CACHE_USAGE: {instance("a"): 0.9, instance("b"): 0.9},
        }
    )
    assert isinstance(out, NoOp) and "no vLLM instance" in out.reason


def test_kv_sparse_requests_compaction_middle_does_nothing() -> None:
    sparse = kv({c.KV_CACHE_HIT_RATE: {instance("a"): 0.5}, c.KV_CACHE_USAGE: {instance("a"): 0.2}})
    assert isinstance(sparse, CompactionRequest)
    middle = kv(
        {c.KV_CACHE_HIT_RATE: {instance("a"): 0.5}, c.KV_CACHE_USAGE: {instance("a"): 0.65}}
    )
    assert isinstance(middle, NoOp)
    recent = kv(
        {c.KV_CACHE_HIT_RATE: {instance("a"): 0.5}, c.KV_CACHE_USAGE: {instance("a"): 0.2}},
        state=TunerState(last_compaction_at=AT - 60),
    )
    assert isinstance(recent, NoOp) and "compaction_min_interval" in recent.reason


FULL: dict[str, Spec] = {
    c.KV_CACHE_HIT_RATE: {instance("a"): 0.5},
    c.KV_CACHE_USAGE: {instance("a"): 0.9},
}


def test_a_kv_share_that_moves_no_workloads_kv_bytes_is_not_proposed() -> None:
    """At 0.85 the 8B model's KV is bounded by GPU - weights - activation reserve, not by
    the share: 0.9 would change no --kv-cache-memory-bytes."""
    at_weights = POLICY.model_copy(
        update={"kv_cache": POLICY.kv_cache.model_copy(update={"max_gpu_memory_share": 0.85})}
    )
    out = kv(FULL, policy=at_weights)
    assert isinstance(out, NoOp) and "changes no workload's --kv-cache-memory-bytes" in out.reason
    assert "weights, not the share" in out.reason
    assert isinstance(kv(FULL), Proposal)  # 0.75 -> 0.8 moves it


def test_kv_share_without_a_model_config_is_not_proposed() -> None:
    out = kv(FULL, models={})
    assert isinstance(out, NoOp) and "no model config" in out.reason


def test_proposal_breaking_an_invariant_is_not_proposed() -> None:
    # activation_reserve 0.08 + share 0.95 >= 1: the policy's own invariant refuses it
    settings = TunerSettings(kv_share_step=0.2, kv_share_max=0.95)
    d = run(snap(FULL), settings=settings)
    assert d.proposal is None
    assert any("invalid" in n.reason and "max_gpu_memory_share" in n.reason for n in d.noops)


# --- one cycle ------------------------------------------------------------------------------


def test_cooldown_holds_proposals_and_priority_picks_one() -> None:
    storm_and_kv = snap({c.FLEX_EVICTIONS: PREEMPTED, **FULL})
    d = run(storm_and_kv)
    assert d.proposal is not None and d.proposal.rule == "eviction-storm"
    assert any(n.rule == "kv-hit-rate" and n.reason.startswith("deferred") for n in d.noops)
    cooling = run(storm_and_kv, TunerState(last_proposal_at=AT - 600))
    assert cooling.proposal is None


def test_apply_changes_validates() -> None:
    d = run(snap({c.FLEX_EVICTIONS: PREEMPTED}))
    assert d.proposal is not None
    after = apply_changes(POLICY, d.proposal.changes)
    assert after.prod_pool.reserve_ratio == 0.25


def test_combine_keeps_nan_and_split_keeps_label_sets_apart() -> None:
    a = [(1.0, 0.9), (2.0, 0.8)]
    b = [(1.0, 0.5), (2.0, math.nan)]
    out = combine([a, b], Combine.MIN)
    assert out[0] == (1.0, 0.5) and math.isnan(out[1][1])
    assert combine([a, a], Combine.SUM) == ((1.0, 1.8), (2.0, 1.6))
    snapshot = snap({c.FLEX_EVICTIONS: reasons(preemption=2.0, kubelet=3.0)})
    assert snapshot.windows[c.FLEX_EVICTIONS].values[0] == 5.0
    parts = split(snapshot, c.FLEX_EVICTIONS, ("reason",))
    assert parts[("kubelet",)].values[0] == 3.0
    assert parts[("kubelet",)].name == 'gpupool:flex_evictions:per_minute{reason="kubelet"}'
