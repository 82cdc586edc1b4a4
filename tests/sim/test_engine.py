"""The closed loop as a system: conservation, preemption, determinism, and the loop checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from infra.builders.stack_options import HpaTolerance, StackOptions
from policy import PoolPolicy, load_policy, parse_policy
from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Node, Phase
from runtime.sim.engine import replay_fixed, replay_pooled
from runtime.sim.production import ProductionRule, need_gpus, production_groups
from runtime.sim.replay_model import FlexInput, Layout, Replay, Settings
from runtime.sim.report import summarize
from runtime.sim.request_stream import Requests
from runtime.sim.serving import Fleet
from runtime.sim.traces import ProductionTrace, diurnal


class Latencies:
    def prefill_s(self, tokens: object) -> np.ndarray:
        return np.asarray(tokens, dtype=np.float64) * 2e-5 + 0.005

    def decode_step_s(self, batch: object, context: object) -> np.ndarray:
        b = np.asarray(batch, dtype=np.float64)
        return 0.005 + 0.00004 * b


def _stream(n: int, *, backlog: bool, spacing_s: float = 0.5) -> Requests:
    rng = np.random.default_rng(7)
    return Requests(
        np.zeros(n) if backlog else np.arange(n) * spacing_s,
        rng.integers(100, 3000, n).astype(np.int64),
        rng.integers(10, 400, n).astype(np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        backlog=backlog,
    )


def _flat(held: int, busy: float, hours: float = 2) -> ProductionTrace:
    n = int(hours * 60)
    return ProductionTrace(
        "flat", 0.0, 60.0, np.full(n, held, dtype=np.int64), np.full(n, busy, dtype=np.float64)
    )


def _without_production(policy: PoolPolicy) -> dict[str, Any]:
    """The policy as a document without production workloads (the replay's production
    follows the trace), so a test may shrink the pools."""
    document = policy.model_dump(mode="json")
    document["production"] = []
    return document


DUTY = ProductionRule("duty")


def _run(
    policy: PoolPolicy,
    trace: ProductionTrace,
    requests: Requests,
    hours: float = 2,
    hpa_tolerance: HpaTolerance = "cluster",
    rule: ProductionRule = DUTY,
) -> tuple[Replay, Replay]:
    """Both replays; production is one-GPU pods on the duty rule unless ``rule`` says."""
    flex = [FlexInput(policy.workloads[0], requests, 100_000, Latencies(), backlog_window=2048)]
    settings = Settings(
        hours=hours,
        flex_startup_s=60,
        stack=StackOptions(hpa_tolerance=hpa_tolerance),
        production=rule,
    )
    layout = Layout.of_policy(policy)
    pooled = replay_pooled(policy, layout, trace, flex, settings)
    fixed = replay_fixed(policy, layout, trace, flex, settings)
    return pooled, fixed


def test_every_request_is_served_queued_or_dropped() -> None:
    policy = load_policy()
    n = 20_000
    requests = _stream(n, backlog=False, spacing_s=0.3)
    long = requests.input_tokens.copy()
    long[::50] = 9_000  # over max_model_len 8192: vLLM rejects these
    requests = Requests(
        requests.arrival_s,
        long,
        requests.output_tokens,
        requests.prefix_tokens,
        requests.prefix_last_seen,
        requests.hashed,
    )
    pooled, fixed = _run(policy, diurnal(hours=2, peak_gpus=60, trough_gpus=4, seed=1), requests)
    for replay in (pooled, fixed):
        (totals,) = replay.fleets.values()
        horizon = 2 * 3600
        arrived_total = int((requests.arrival_s <= horizon).sum())
        assert totals.dropped == int(
            (
                (long > 8192 - 400)
                & (long + requests.output_tokens > 8192)
                & (requests.arrival_s <= horizon)
            ).sum()
        )
        assert totals.arrived + totals.dropped == arrived_total
        assert totals.completed + totals.outstanding == totals.arrived
        assert totals.completed > 0


def test_production_preempts_flex_and_never_waits_for_a_gpu_flex_could_give() -> None:
    """Production grows past gpu-prod into gpu-flex: flex pods are preempted (graceful), the
    production pods bind once the victims exit, and none waits longer than the shutdown."""
    policy = load_policy()
    n = 120
    held = np.full(n, 10, dtype=np.int64)
    held[30:] = 94  # duty rule at 0.6: 94 replicas, 30 beyond gpu-prod's 64 GPUs
    trace = ProductionTrace("burst", 0.0, 60.0, held, held * 0.6)
    pooled, _ = _run(policy, trace, _stream(64, backlog=True))
    s = pooled.series
    assert sum(s.evictions) > 0
    pending = np.asarray(s.prod_pending)
    step_s = pooled.step_s
    longest = max(
        (len(run) for run in "".join("1" if p else "0" for p in pending).split("0")), default=0
    )
    assert longest * step_s <= policy.disruption.shutdown_budget_s + step_s
    assert np.asarray(s.prod_gpus)[-1] == 94


def test_scheduler_preempts_lowest_priority_first() -> None:
    cluster = Cluster({"p": [Node("n", "p", 2, 2)]}, shutdown_s=30, pdb_min_available=0)
    low = cluster.create(
        owner="a",
        production=False,
        gpus=1,
        priority=-1,
        may_preempt=False,
        pools=("p",),
        now=0,
        startup_s=0,
    )
    mid = cluster.create(
        owner="b",
        production=False,
        gpus=1,
        priority=100,
        may_preempt=True,
        pools=("p",),
        now=0,
        startup_s=0,
    )
    cluster.schedule(0)
    top = cluster.create(
        owner="c",
        production=True,
        gpus=1,
        priority=1000,
        may_preempt=True,
        pools=("p",),
        now=1,
        startup_s=0,
    )
    evictions = cluster.schedule(1)
    assert [e.pod for e in evictions] == [low]
    assert mid.phase is Phase.STARTING and low.phase is Phase.TERMINATING
    assert top.nominated is not None and top.phase is Phase.PENDING
    cluster.advance(31)
    cluster.schedule(31)
    assert top.phase is Phase.STARTING and low.phase is Phase.GONE


def test_a_flex_pod_never_preempts() -> None:
    cluster = Cluster({"p": [Node("n", "p", 1, 1)]}, shutdown_s=30, pdb_min_available=0)
    cluster.create(
        owner="x",
        production=False,
        gpus=1,
        priority=-1,
        may_preempt=False,
        pools=("p",),
        now=0,
        startup_s=0,
    )
    cluster.schedule(0)
    late = cluster.create(
        owner="y",
        production=False,
        gpus=1,
        priority=-1,
        may_preempt=False,
        pools=("p",),
        now=1,
        startup_s=0,
    )
    assert cluster.schedule(1) == []
    assert late.phase is Phase.PENDING


def test_same_inputs_same_result() -> None:
    policy = load_policy()
    trace = diurnal(hours=2, peak_gpus=40, trough_gpus=4, seed=5)
    a, _ = _run(policy, trace, _stream(64, backlog=True))
    b, _ = _run(policy, trace, _stream(64, backlog=True))
    assert summarize(a, policy) == summarize(b, policy)
    c, _ = _run(
        policy, diurnal(hours=2, peak_gpus=40, trough_gpus=4, seed=6), _stream(64, backlog=True)
    )
    assert summarize(c, policy) != summarize(a, policy)


def test_fixed_baseline_gives_flex_only_gpus_production_never_holds() -> None:
    policy = load_policy()
    trace = _flat(60, 3.0)
    _, fixed = _run(policy, trace, _stream(64, backlog=True))
    total = Layout.of_policy(policy).total_gpus
    assert set(fixed.series.flex_gpus) == {total - 60}, "every GPU production never holds"
    assert sum(fixed.series.evictions) == 0


# Closed-loop properties of the pooling loop, each proven on a replay built to break it.


@pytest.mark.parametrize(("tolerance", "grown"), [("cluster", range(29, 33)), ("behavior", [32])])
def test_idle_flex_fleet_is_bounded_by_unallocated_gpus(
    tolerance: HpaTolerance, grown: Sequence[int]
) -> None:
    """Idle flex replicas hold their GPUs: the budget never counts them as headroom, so an
    idle fleet grows only into GPUs nobody requests and leaves no pod pending. With the
    controller's 10 % tolerance the last replicas of the pool may be swallowed once the
    HPA's +2 pods a minute have brought it close; a per-HPA tolerance of 0 fills it."""
    document = _without_production(load_policy())
    document["node_pools"][0]["lend_idle"] = False  # the flex pool's 32 GPUs bound it
    document["workloads"][0]["max_replicas"] = 40  # more than the 32-GPU flex pool holds
    policy = parse_policy(document)
    pooled, _ = _run(
        policy, _flat(4, 0.2), _stream(1, backlog=False, spacing_s=1e9), hpa_tolerance=tolerance
    )
    checks = summarize(pooled, policy).checks
    assert checks["flex_budget_beyond_pool_gpus_max"] == 0
    assert checks["flex_pods_pending_max"] == 0
    assert max(pooled.series.flex_gpus) in grown


def test_busy_flex_with_idle_production_never_sheds_itself() -> None:
    """Flex at 100 % duty on most of the cluster while production is idle: the signal is
    production's share, so flex holds."""
    document = _without_production(load_policy())
    document["node_pools"][0]["max_nodes"] = 1  # gpu-prod 8 GPUs, gpu-flex 32
    document["workloads"][0]["max_replicas"] = 32
    document["workloads"][0]["min_replicas"] = 28  # 28 busy of 40 GPUs
    policy = parse_policy(document)
    pooled, _ = _run(policy, _flat(1, 0.0), _stream(5_000, backlog=True))
    summary = summarize(pooled, policy)
    assert summary.flex_duty_cycle > 0.95
    assert summary.checks["flex_self_shed_minutes"] == 0
    assert min(pooled.series.flex_gpus[40:]) >= 28


def _ramp(start: int, end: int, per_minute: float, hours: float = 2) -> ProductionTrace:
    """``start`` GPUs busy for 30 minutes, then ``per_minute`` more each minute up to ``end``."""
    minutes = np.arange(int(hours * 60))
    held = np.minimum(start + np.floor((minutes - 30).clip(0) * per_minute), end)
    return ProductionTrace("ramp", 0.0, 60.0, held.astype(np.int64), held * 1.0)


def test_production_rising_past_the_reserve_sheds_flex_before_production_waits() -> None:
    """Production grows steadily from gpu-prod into gpu-flex: the reserve sheds flex ahead
    of it, so no production pod ever waits and no flex pod is preempted."""
    document = _without_production(load_policy())
    document["workloads"][0]["max_replicas"] = 32
    policy = parse_policy(document)
    # held x 1.0 busy with the duty rule at 0.6: 60 % more replicas than held GPUs.
    trace = _ramp(10, 50, per_minute=0.5)
    pooled, _ = _run(policy, trace, _stream(5_000, backlog=True))
    s = pooled.series
    assert max(s.prod_need) > 64, "production must outgrow gpu-prod for the test to mean much"
    assert max(s.flex_gpus) >= 24, "flex must have grown into the flex pool first"
    assert sum(s.prod_pending) == 0
    assert sum(s.evictions) == 0
    assert s.flex_gpus[-1] < max(s.flex_gpus)


def test_without_a_reserve_the_same_ramp_preempts_flex() -> None:
    """The control for the test above: with every reserve at 0, production only gets flex's
    GPUs by preemption, so the reserve is what made the difference."""
    document = _without_production(load_policy())
    document["workloads"][0]["max_replicas"] = 32
    for pool in document["node_pools"]:
        pool["reserve_ratio"] = 0.0
    policy = parse_policy(document)
    pooled, _ = _run(policy, _ramp(10, 50, per_minute=0.5), _stream(5_000, backlog=True))
    assert sum(pooled.series.evictions) > 0


@pytest.mark.parametrize(("lend", "answer"), [(False, 0.4), (True, 0.6)])
def test_an_eviction_storm_is_counted_and_a_larger_reserve_answers_it(
    lend: bool, answer: float
) -> None:
    """Production waves (2 GPUs a minute, 20 -> 80 GPUs and back) preempt flex on every
    crest; the tuner's lever for that (a larger production reserve) changes the rendered
    budget, and replayed it sheds flex ahead of the crest instead. Flex on gpu-prod's own
    nodes (lending) must give back at the pace production climbs, which the HPA's
    scale-down window and rate slow: the reserve that answers it is larger."""
    t = np.arange(240)
    phase = t % 60
    held = (20 + np.where(phase < 30, 2 * phase, 60 - 2 * (phase - 30))).astype(np.int64)
    trace = ProductionTrace("waves", 0.0, 60.0, held, held * 0.6)
    document = _without_production(load_policy())
    document["node_pools"][0]["lend_idle"] = lend
    document["workloads"][0]["max_replicas"] = 32
    for pool in document["node_pools"]:
        pool["reserve_ratio"] = 0.0
    low = parse_policy(document)
    document["node_pools"][0]["reserve_ratio"] = answer
    high = parse_policy(document)
    stormy, _ = _run(low, trace, _stream(5_000, backlog=True), hours=4)
    calmer, _ = _run(high, trace, _stream(5_000, backlog=True), hours=4)
    before, after = summarize(stormy, low), summarize(calmer, high)
    assert before.evictions_total > 10
    assert after.evictions_total == 0
    assert after.checks["prod_wait_max_s"] == 0


@pytest.mark.parametrize("backlog", [False, True])
def test_bisection_on_sums_serves_what_costing_each_request_serves(backlog: bool) -> None:
    """Streams without prefix data take the running-sum path; it must match the per-request
    path step by step (same completions and tokens, the same carried credit)."""
    streams = [_stream(5_000, backlog=backlog, spacing_s=0.05) for _ in range(2)]
    fleets = [
        Fleet.admit(
            s,
            max_model_len=8192,
            latencies=Latencies(),
            kv_tokens=100_000,
            max_num_seqs=64,
            preservation=False,
            backlog_window=512,
        )
        for s in streams
    ]
    fast, slow = fleets
    assert fast._queue.by_sums
    slow._queue.by_sums = False
    for step, replicas in enumerate([1, 3, 3, 0, 8, 2, 5, 5, 1, 4] * 3):
        a = fast.serve(step * 15.0, 15.0, replicas)
        b = slow.serve(step * 15.0, 15.0, replicas)
        assert (a.completed, a.output_tokens, a.prompt_tokens, a.query_tokens) == (
            b.completed,
            b.output_tokens,
            b.prompt_tokens,
            b.query_tokens,
        ), step
        assert a.busy == pytest.approx(b.busy, rel=1e-9)
        assert fast.credit == pytest.approx(slow.credit, rel=1e-9, abs=1e-9)
    assert fast.done == slow.done > 0


def test_ties_break_by_creation_order_not_by_memory_layout() -> None:
    """Pods created in the same step are ordered by uid (sets iterate by address), so a
    replay gives the same result in every process."""
    cluster = Cluster({"p": [Node("n", "p", 8, 8)]}, shutdown_s=30, pdb_min_available=0)
    pods = [
        cluster.create(
            owner="a",
            production=False,
            gpus=1,
            priority=-1,
            may_preempt=False,
            pools=("p",),
            now=0,
            startup_s=0,
        )
        for _ in range(6)
    ]
    cluster.schedule(0)
    assert cluster.scale_down_order(reversed(pods)) == pods[::-1]
    assert cluster.scale_down_order(pods) == pods[::-1]
    top = cluster.create(
        owner="b",
        production=True,
        gpus=3,
        priority=10,
        may_preempt=True,
        pools=("p",),
        now=1,
        startup_s=0,
    )
    cluster.create(
        owner="c",
        production=True,
        gpus=5,
        priority=10,
        may_preempt=True,
        pools=("p",),
        now=1,
        startup_s=0,
    )
    evicted = [e.pod for e in cluster.schedule(1)]
    assert top.nominated is not None or top.phase is Phase.STARTING
    assert evicted == sorted(evicted, key=lambda p: -p.uid)


def _longest_wait_steps(pending: Sequence[int]) -> int:
    return max(
        (len(run) for run in "".join("1" if p else "0" for p in pending).split("0")), default=0
    )


def test_policy_production_workloads_scale_on_their_hpa_and_take_gpus_back_from_flex() -> None:
    """The default policy's llama-70b-prod (4-GPU pods, HPA on mean duty 0.6, 2-12
    replicas): a burst to 28 busy GPU-equivalents scales it to ceil(28 / 2.4) = 12 replicas,
    48 GPUs, 16 beyond a 32-GPU gpu-prod and into a gpu-flex that flex has filled: flex pods
    are preempted and no production pod waits longer than a flex pod's graceful shutdown
    (plus one step)."""
    document = load_policy().model_dump(mode="json")
    document["node_pools"][0]["max_nodes"] = 4
    document["workloads"][0]["max_replicas"] = 32
    policy = parse_policy(document)
    n = 180
    busy = np.full(n, 2.0)
    busy[40:] = 28.0
    held = np.full(n, 48, dtype=np.int64)
    trace = ProductionTrace("burst", 0.0, 60.0, held, busy)
    # Flex first fills the cluster: gpu-prod's unreserved GPUs and gpu-flex.
    pooled, _ = _run(policy, trace, _stream(4096, backlog=True), hours=3, rule=ProductionRule())
    s = pooled.series
    need = np.asarray(s.prod_need)
    assert need[0] == 2 * 4  # min_replicas at 2 busy GPU-equivalents
    assert need[-1] == 12 * 4  # the HPA's answer, capped at max_replicas
    assert np.asarray(s.prod_gpus)[-1] == 48
    assert sum(s.evictions) > 0
    assert _longest_wait_steps(s.prod_pending) * pooled.step_s <= (
        policy.disruption.shutdown_budget_s + pooled.step_s
    )
    # The HPA scales up at once (scale_up_stabilization_s 0) and the pods serve the burst.
    burst = np.asarray(s.t) >= 40 * 60 + 3600 * 0.5
    assert np.allclose(np.asarray(s.prod_busy_served)[burst], 28.0)


def test_policy_production_workloads_split_the_load_by_their_ceilings() -> None:
    """Two workloads, one fixed and one on an HPA: the fixed one runs max_replicas all the
    time; the HPA one serves its share of the load (ceiling 8 of 24 GPUs: a third)."""
    document = load_policy().model_dump(mode="json")
    document["production"] = [
        {"namespace": "inference", "name": "fixed-prod", "gpus_per_replica": 2,
         "min_replicas": 8, "max_replicas": 8},
        {"namespace": "inference", "name": "elastic-prod", "gpus_per_replica": 1,
         "max_replicas": 8, "scale_on": "external"},
    ]  # fmt: skip
    policy = parse_policy(document)
    groups = production_groups(policy, ProductionRule())
    assert [(g.owner, g.scaling, round(g.share, 3)) for g in groups] == [
        ("inference/fixed-prod", "fixed", 0.667),
        ("inference/elastic-prod", "hpa", 0.333),
    ]
    trace = _flat(held=24, busy=6.0)
    pooled, _ = _run(policy, trace, _stream(64, backlog=True), rule=ProductionRule())
    # fixed: 8 x 2 GPUs; external (assumed target 0.6): ceil(6 / 3 / 0.6) = 4 one-GPU pods.
    assert need_gpus(groups, trace, ProductionRule())[0] == 16 + 4
    assert pooled.series.prod_need[-1] == 16 + 4
    assert pooled.series.prod_gpus[-1] == 16 + 4


def test_without_production_workloads_the_policy_rule_falls_back_to_duty() -> None:
    policy = parse_policy(_without_production(load_policy()))
    (group,) = production_groups(policy, ProductionRule())
    assert group.scaling == "trace" and group.gpus_per_replica == 1
    trace = _flat(held=20, busy=6.0)
    assert need_gpus((group,), trace, ProductionRule())[0] == 10  # ceil(6 / 0.6)
