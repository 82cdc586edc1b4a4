"""Pure decisions on hand-built windows: levers, bounds, hysteresis, cooldown, fail closed."""

from __future__ import annotations

import math

import pytest

from policy import DEFAULT_POLICY, load_policy
from runtime.metrics import catalogue as c
from runtime.tuner.decisions import (
    CompactionRequest,
    NoOp,
    Proposal,
    TunerState,
    apply_changes,
    decide,
    eviction_storm,
    idle_flex_demand,
    kv_capacity,
)
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import Combine, combine
from runtime.tuner.snapshot import MetricsSnapshot, Window

AT = 1_000_000.0
SETTINGS = TunerSettings()
POLICY = load_policy(DEFAULT_POLICY)
QUIET = {
    c.CLUSTER_GPU_UTILIZATION: 0.5,
    c.FLEX_EVICTIONS: 0.0,
    c.PROD_PODS_PENDING: 0.0,
    c.VLLM_QUEUE_DEPTH: 0.0,
    c.FLEX_HEADROOM_GPUS: 4.0,
    c.KV_CACHE_USAGE: 0.6,
    c.KV_CACHE_HIT_RATE: 0.95,
}


def snap(
    overrides: dict[str, float | list[float]] | None = None,
    *,
    span_s: float = 1800,
    drop: tuple[str, ...] = (),
    age_s: float = 0,
) -> MetricsSnapshot:
    """Every series sampled each 30 s over ``span_s`` ending ``age_s`` before AT."""
    values = {**QUIET, **(overrides or {})}
    times = [AT - age_s - span_s + 30 * i for i in range(int(span_s // 30) + 1)]
    windows = {}
    for name, v in values.items():
        if name in drop:
            continue
        series = v if isinstance(v, list) else [v] * len(times)
        windows[name] = Window(name, tuple(zip(times, series, strict=True)))
    return MetricsSnapshot(at=AT, windows=windows)


def test_quiet_cluster_is_all_noops() -> None:
    d = decide(policy=POLICY, snapshot=snap(), state=TunerState(), settings=SETTINGS)
    assert d.proposal is None and d.compaction is None
    assert all(n.fail_closed is None for n in d.noops)


def test_storm_with_pending_production_raises_reserve_by_one_step() -> None:
    out = eviction_storm(
        policy=POLICY,
        snapshot=snap({c.FLEX_EVICTIONS: 9, c.PROD_PODS_PENDING: 1}),
        settings=SETTINGS,
    )
    assert isinstance(out, Proposal)
    [change] = out.changes
    assert change.path == ("node_pools", 0, "reserve_ratio")
    assert (change.before, change.after) == (0.2, 0.25)
    assert not out.adds_flex_load


def test_storm_reaching_shed_band_raises_shed_above() -> None:
    out = eviction_storm(
        policy=POLICY,
        snapshot=snap({c.FLEX_EVICTIONS: 9, c.CLUSTER_GPU_UTILIZATION: 0.66}),
        settings=SETTINGS,
    )
    assert isinstance(out, Proposal)
    assert [(ch.path, ch.after) for ch in out.changes] == [(("elastic", "shed_above"), 0.7)]
    assert out.adds_flex_load


def test_storm_without_pressure_lengthens_scale_down_window() -> None:
    out = eviction_storm(policy=POLICY, snapshot=snap({c.FLEX_EVICTIONS: 9}), settings=SETTINGS)
    assert isinstance(out, Proposal)
    assert [(ch.path, ch.after) for ch in out.changes] == [
        (("autoscaling", "scale_down_stabilization_s"), 420)
    ]


def test_storm_with_stale_pending_never_raises_shed_above() -> None:
    snapshot = snap(
        {c.FLEX_EVICTIONS: 9, c.CLUSTER_GPU_UTILIZATION: 0.7}, drop=(c.PROD_PODS_PENDING,)
    )
    out = eviction_storm(policy=POLICY, snapshot=snapshot, settings=SETTINGS)
    assert isinstance(out, Proposal) and not out.adds_flex_load
    assert out.changes[0].path == ("autoscaling", "scale_down_stabilization_s")


def test_storm_steps_are_bounded() -> None:
    settings = TunerSettings(reserve_ratio_max=0.22)
    out = eviction_storm(
        policy=POLICY,
        snapshot=snap({c.FLEX_EVICTIONS: 9, c.PROD_PODS_PENDING: 1}),
        settings=settings,
    )
    assert isinstance(out, Proposal) and out.changes[0].after == 0.22


def test_brief_eviction_spike_is_not_sustained() -> None:
    spiky = [9.0 if i % 3 == 0 else 0.0 for i in range(61)]
    out = eviction_storm(policy=POLICY, snapshot=snap({c.FLEX_EVICTIONS: spiky}), settings=SETTINGS)
    assert isinstance(out, NoOp) and "sustained" in out.reason


def test_hysteresis_margin_ignores_utilization_at_the_threshold() -> None:
    at_threshold = snap({c.CLUSTER_GPU_UTILIZATION: 0.34, c.VLLM_QUEUE_DEPTH: 5})
    assert isinstance(
        idle_flex_demand(policy=POLICY, snapshot=at_threshold, settings=SETTINGS), NoOp
    )
    clearly_idle = snap({c.CLUSTER_GPU_UTILIZATION: 0.30, c.VLLM_QUEUE_DEPTH: 5})
    out = idle_flex_demand(policy=POLICY, snapshot=clearly_idle, settings=SETTINGS)
    assert isinstance(out, Proposal) and out.changes[0].after == 10


def test_flex_widening_needs_idle_flex_gpus() -> None:
    no_room = snap({c.CLUSTER_GPU_UTILIZATION: 0.1, c.VLLM_QUEUE_DEPTH: 5, c.FLEX_HEADROOM_GPUS: 0})
    out = idle_flex_demand(policy=POLICY, snapshot=no_room, settings=SETTINGS)
    assert isinstance(out, NoOp) and "flex_headroom_gpus" in out.reason


def test_flex_widening_stops_at_pool_capacity() -> None:
    idle = snap({c.CLUSTER_GPU_UTILIZATION: 0.1, c.VLLM_QUEUE_DEPTH: 5})
    full = POLICY.model_copy(
        update={"workloads": [POLICY.workloads[0].model_copy(update={"max_replicas": 32})]}
    )  # 4 nodes x 8 GPUs
    out = idle_flex_demand(policy=full, snapshot=idle, settings=SETTINGS)
    assert isinstance(out, NoOp) and "max_nodes" in out.reason


@pytest.mark.parametrize(
    ("drop", "age_s", "nan", "kind"),
    [((c.VLLM_QUEUE_DEPTH,), 0, False, "absent"), ((), 600, False, "stale"), ((), 0, True, "nan")],
)
def test_flex_widening_fails_closed(
    drop: tuple[str, ...], age_s: float, nan: bool, kind: str
) -> None:
    overrides: dict[str, float | list[float]] = {
        c.CLUSTER_GPU_UTILIZATION: 0.1,
        c.VLLM_QUEUE_DEPTH: math.nan if nan else 5,
    }
    out = idle_flex_demand(
        policy=POLICY, snapshot=snap(overrides, drop=drop, age_s=age_s), settings=SETTINGS
    )
    assert isinstance(out, NoOp) and out.fail_closed == kind


def test_unreachable_prometheus_fails_every_rule_closed() -> None:
    d = decide(
        policy=POLICY,
        snapshot=MetricsSnapshot(at=AT, unreachable="refused"),
        state=TunerState(),
        settings=SETTINGS,
    )
    assert d.proposal is None and d.compaction is None
    assert {n.fail_closed for n in d.noops} == {"unreachable"}


def test_short_history_is_not_enough() -> None:
    out = idle_flex_demand(
        policy=POLICY,
        snapshot=snap({c.CLUSTER_GPU_UTILIZATION: 0.1, c.VLLM_QUEUE_DEPTH: 5}, span_s=600),
        settings=SETTINGS,
    )
    assert isinstance(out, NoOp) and out.fail_closed is None and "not enough history" in out.reason


def test_kv_full_raises_share_sparse_requests_compaction_middle_does_nothing() -> None:
    full = kv_capacity(
        policy=POLICY,
        snapshot=snap({c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.9}),
        state=TunerState(),
        settings=SETTINGS,
    )
    assert isinstance(full, Proposal) and full.changes[0].after == 0.8
    sparse = kv_capacity(
        policy=POLICY,
        snapshot=snap({c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.2}),
        state=TunerState(),
        settings=SETTINGS,
    )
    assert isinstance(sparse, CompactionRequest)
    middle = kv_capacity(
        policy=POLICY,
        snapshot=snap({c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.65}),
        state=TunerState(),
        settings=SETTINGS,
    )
    assert isinstance(middle, NoOp)
    recent = kv_capacity(
        policy=POLICY,
        snapshot=snap({c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.2}),
        state=TunerState(last_compaction_at=AT - 60),
        settings=SETTINGS,
    )
    assert isinstance(recent, NoOp) and "compaction_min_interval" in recent.reason


def test_proposal_breaking_an_invariant_is_not_proposed() -> None:
    # activation_reserve 0.08 + share 0.95 >= 1: the policy's own invariant refuses it
    settings = TunerSettings(kv_share_step=0.2, kv_share_max=0.95)
    d = decide(
        policy=POLICY,
        snapshot=snap({c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.9}),
        state=TunerState(),
        settings=settings,
    )
    assert d.proposal is None
    assert any("invalid" in n.reason and "max_gpu_memory_share" in n.reason for n in d.noops)


def test_cooldown_holds_proposals_and_priority_picks_one() -> None:
    storm_and_kv = snap({c.FLEX_EVICTIONS: 9, c.KV_CACHE_HIT_RATE: 0.5, c.KV_CACHE_USAGE: 0.9})
    d = decide(policy=POLICY, snapshot=storm_and_kv, state=TunerState(), settings=SETTINGS)
    assert d.proposal is not None and d.proposal.rule == "eviction-storm"
    assert any(n.rule == "kv-hit-rate" and n.reason.startswith("deferred") for n in d.noops)
    cooling = decide(
        policy=POLICY,
        snapshot=storm_and_kv,
        state=TunerState(last_proposal_at=AT - 600),
        settings=SETTINGS,
    )
    assert cooling.proposal is None


def test_apply_changes_validates() -> None:
    d = decide(
        policy=POLICY, snapshot=snap({c.FLEX_EVICTIONS: 9}), state=TunerState(), settings=SETTINGS
    )
    assert d.proposal is not None
    after = apply_changes(POLICY, d.proposal.changes)
    assert after.autoscaling.scale_down_stabilization_s == 420


def test_combine_takes_the_worst_hit_rate_and_keeps_nan() -> None:
    a = [(1.0, 0.9), (2.0, 0.8)]
    b = [(1.0, 0.5), (2.0, math.nan)]
    out = combine([a, b], Combine.MIN)
    assert out[0] == (1.0, 0.5) and math.isnan(out[1][1])
    assert combine([a, a], Combine.SUM) == ((1.0, 1.8), (2.0, 1.6))


def test_staleness_follows_the_policy_evaluation_interval() -> None:
    idle = {c.CLUSTER_GPU_UTILIZATION: 0.1, c.VLLM_QUEUE_DEPTH: 5}
    aged = snap(idle, age_s=100)  # 3 x 30 s = 90 s: stale
    out = idle_flex_demand(policy=POLICY, snapshot=aged, settings=SETTINGS)
    assert isinstance(out, NoOp) and out.fail_closed == "stale"
    slower = POLICY.model_copy(
        update={"metrics": POLICY.metrics.model_copy(update={"evaluation_interval": "1m"})}
    )
    assert isinstance(idle_flex_demand(policy=slower, snapshot=aged, settings=SETTINGS), Proposal)


def test_storm_with_reserve_at_bound_falls_back_to_the_scale_down_window() -> None:
    settings = TunerSettings(reserve_ratio_max=0.2)  # the shipped reserve is already 0.2
    storm = snap({c.FLEX_EVICTIONS: 9, c.PROD_PODS_PENDING: 1, c.CLUSTER_GPU_UTILIZATION: 0.7})
    out = eviction_storm(policy=POLICY, snapshot=storm, settings=settings)
    assert isinstance(out, Proposal) and not out.adds_flex_load  # never shed_above here
    assert out.changes[0].path == ("autoscaling", "scale_down_stabilization_s")
    assert "reserve_ratio is at its bound" in out.rationale
