"""The tuner in the what-if loop: the series it reads, its real decisions closing the loop,
silence where it has nothing to improve, merges refused, and determinism."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from policy import DEFAULT_POLICY, PoolPolicy, load_policy, parse_policy
from policy.base import duration_seconds
from runtime.metrics import catalogue
from runtime.metrics.evictions import canonical_reasons
from runtime.sim.engine import replay_pooled
from runtime.sim.production import ProductionRule
from runtime.sim.replay_model import FlexInput, Layout, LoopState, Replay, Retune, Settings
from runtime.sim.report import summarize
from runtime.sim.request_stream import Requests
from runtime.sim.traces import ProductionTrace
from runtime.sim.tuning import TunerConfig, TunerLoop, TunerRun, merge
from runtime.tuner.eviction_rule import REASON_LABEL
from runtime.tuner.proposals import Change
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import SIGNALS, split
from runtime.tuner.snapshot import MetricsSnapshot
from runtime.vllm import ModelSpec, load_model_spec, plan_kv_cache
from tests.sim.test_engine import Latencies, _stream

RULE = ProductionRule("duty", target_utilization=0.5)
"""One-GPU production pods, ceil(busy / 0.5): the waves' GPU counts are production's pods."""


def _models(policy: PoolPolicy) -> dict[str, ModelSpec]:
    return {w.name: load_model_spec(DEFAULT_POLICY.parent / w.hf_config) for w in policy.workloads}


def _storm_policy(reserve: float = 0.1) -> PoolPolicy:
    """The shipped policy with flex that regrows within a minute (no scale-up window, 32
    pods a minute, up to the 32 GPUs of gpu-flex) and gpu-prod's reserve at ``reserve``."""
    document = load_policy().model_dump(mode="json")
    document["node_pools"][0]["reserve_ratio"] = reserve
    document["autoscaling"]["scale_up_stabilization_s"] = 0
    document["autoscaling"]["scale_up_pods_per_minute"] = 32
    document["workloads"][0]["max_replicas"] = 32
    return parse_policy(document)


def _waves(hours: float, seed: int | None = None) -> ProductionTrace:
    """Production at 60 GPUs for 3 minutes, 94 for 2, over and over (the 96-GPU cluster:
    gpu-prod 64, gpu-flex 32). Each 5-minute rate window holds one crest: production takes
    30 GPUs of gpu-flex, where flex grew into min(32, 36 - reserve) GPUs in the trough. With
    gpu-prod's reserve at 0.1 (6 GPUs) that is 28 preemptions a crest, 5.6 a minute, above
    the policy's 5; at 0.15 (9 GPUs) 25, 5 a minute, no longer above it. ``seed`` jitters
    each minute by -2..+2 GPUs."""
    minutes = np.arange(int(hours * 60))
    held = np.where(minutes % 5 < 3, 60, 94)
    if seed is not None:
        held = held + np.random.default_rng(seed).integers(-2, 3, held.size)
    held = held.astype(np.int64)
    return ProductionTrace("waves", 0.0, 60.0, held, held * RULE.target_utilization)


def _replay(
    policy: PoolPolicy,
    trace: ProductionTrace,
    hours: float,
    tuning: TunerLoop | Spy | None = None,
    requests: Requests | None = None,
) -> Replay:
    flex = [
        FlexInput(
            policy.workloads[0],
            _stream(5_000, backlog=True) if requests is None else requests,
            100_000,
            Latencies(),
            backlog_window=2048 if requests is None else 0,
        )
    ]
    settings = Settings(hours=hours, flex_startup_s=60, production=RULE)
    layout = Layout.of_policy(policy)
    return replay_pooled(policy, layout, trace, flex, settings, tuning=tuning)


class Spy:
    """The loop's ``Tuning``, keeping every state it was shown."""

    def __init__(self, loop: TunerLoop) -> None:
        self.loop = loop
        self.states: list[LoopState] = []

    def observe(self, state: LoopState) -> Retune | None:
        self.states.append(state)
        return self.loop.observe(state)


def _prefix_stream(hours: float, spacing_s: float = 0.5, shared: int = 512) -> Requests:
    """Requests of 1,000 prompt tokens with block hashes: each shares ``shared`` leading
    tokens with the one before, so vLLM's prefix-cache counters (and the hit rate's series)
    have something to count."""
    n = int(hours * 3600 / spacing_s)
    arrival = np.arange(n) * spacing_s
    prefix = np.full(n, shared, dtype=np.int64)
    prefix[0] = 0
    seen = np.concatenate([[np.nan], arrival[:-1]])
    return Requests(
        arrival,
        np.full(n, 1_000, dtype=np.int64),
        np.full(n, 50, dtype=np.int64),
        prefix,
        seen,
        np.ones(n, dtype=bool),
    )


def _evictions_after(replay: Replay, start_s: float) -> float:
    s = replay.series
    t = np.asarray(s.t)
    keep = t >= start_s
    return float(np.asarray(s.evictions)[keep].sum()) / (keep.sum() * replay.step_s / 60)


def _labelled_snapshot(policy: PoolPolicy) -> tuple[MetricsSnapshot, LoopState]:
    """The snapshot a cycle reads at the end of an hour of waves with hashed requests (every
    one of the tuner's series has rows), and the last state the loop was shown."""
    spy = Spy(TunerLoop(TunerConfig(), _models(policy)))
    _replay(policy, _waves(1), 1, spy, requests=_prefix_stream(1))
    last = spy.states[-1]
    return spy.loop.snapshot(last.at), last


def test_the_replay_records_every_series_the_tuner_reads_with_the_labels_it_splits_by() -> None:
    """Names are the tuner's own ``SIGNALS``; each series splits by the labels the decisions
    split it by into the keys the replay knows: canonical reasons, the workload, its HPA and
    its running vLLM instances."""
    policy = load_policy()
    snapshot, last = _labelled_snapshot(policy)
    assert set(snapshot.series) == set(SIGNALS)
    assert all(snapshot.series[name] for name in SIGNALS), "every series must have rows here"
    m, w = policy.metrics, policy.workloads[0]
    ns = policy.cluster.flex_namespace
    reasons = split(snapshot, catalogue.FLEX_EVICTIONS, (REASON_LABEL, "namespace"))
    assert set(reasons) == {(r, ns) for r in canonical_reasons(policy)}
    assert set(split(snapshot, catalogue.VLLM_QUEUE_DEPTH, (m.workload_label,))) == {(w.name,)}
    hpa = split(snapshot, catalogue.FLEX_HPA_AT_MAX, (catalogue.BUDGET_LABEL,))
    assert set(hpa) == {(w.name,)}
    running = set(last.fleets[w.name].instances)
    assert running and running <= {p.name for p in last.view.pods}
    for name in (catalogue.KV_CACHE_USAGE, catalogue.KV_CACHE_HIT_RATE):
        keys = split(snapshot, name, tuple(m.instance_labels))
        newest = {k for k, window in keys.items() if window.samples[-1][0] == last.at}
        assert newest == {(ns, w.name, pod) for pod in running}, name
    for name in (
        catalogue.PRODUCTION_GPU_UTILIZATION,
        catalogue.PROD_PODS_PENDING,
    ):
        assert [s.labels for s in snapshot.series[name]] == [()], name
    assert [s.labels for s in snapshot.series[catalogue.FLEX_HEADROOM_GPUS]] == [
        (("pool", p.name),) for p in policy.harvest_pools
    ]
    assert policy.lending_pools, "the shipped policy lends gpu-prod: its headroom is recorded"
    # A 30m window of the 30 s evaluations, as the range selector returns it.
    (utilization,) = snapshot.series[catalogue.PRODUCTION_GPU_UTILIZATION]
    assert len(utilization.samples) == 60
    assert utilization.samples[-1][0] == snapshot.at


@pytest.mark.slow
def test_the_recorded_labels_are_the_ones_prometheus_returns(tmp_path: Path) -> None:
    """The shipped recording rules, evaluated by promtool over the tuner's scenario series
    and read through the tuner's own ``fetch_snapshot``, return the same label names and
    the same values of every label but ``pod`` (instances differ) as the replay records."""
    from runtime.tuner.prometheus import connect, fetch_snapshot
    from runtime.tuner.selfmetrics import TunerMetrics
    from tests.tuner import scenarios

    def shape(snapshot: MetricsSnapshot) -> dict[str, set[tuple[tuple[str, str], ...]]]:
        return {
            name: {tuple((k, "*" if k == "pod" else v) for k, v in s.labels) for s in found}
            for name, found in snapshot.series.items()
        }

    server = scenarios.build_prometheus(tmp_path)
    try:
        real = fetch_snapshot(
            connect(server.url),
            signals=SIGNALS,
            at=scenarios.evaluation_time("storm"),
            window=TunerSettings().window,
            metrics=TunerMetrics.create(),
        )
    finally:
        server.stop()
    replayed, _ = _labelled_snapshot(scenarios.POLICY)
    assert all(real.series[name] for name in SIGNALS), "the scenario must have every series"
    assert shape(replayed) == shape(real)


def test_a_preemption_storm_raises_the_reserve_and_the_replay_evicts_less() -> None:
    """Waves of production preempt flex 5.6 times a minute: the real eviction-storm rule
    proposes gpu-prod's reserve 0.1 -> 0.15, the merge (one interval later) takes effect in
    the loop, and from then on the replay evicts less than the same replay without the
    tuner; the storm is over, so no second proposal follows."""
    policy, hours = _storm_policy(0.1), 3.0
    spy = Spy(TunerLoop(TunerConfig(), _models(policy)))
    tuned = _replay(policy, _waves(hours), hours, spy)
    untuned = _replay(policy, _waves(hours), hours)
    run = spy.loop.run(tuned)
    (proposal,) = run.proposals
    assert proposal.rule == "eviction-storm"
    ((field, before, after),) = [(c.field, c.before, c.after) for c in proposal.changes]
    assert (field, before, after) == ("node_pools.0.reserve_ratio", 0.1, 0.15)
    assert "preempted flex pods persistently" in proposal.why
    assert proposal.outcome == "applied"
    merged_at = proposal.proposed_at_s + TunerSettings().interval_s
    assert proposal.decided_at_s == merged_at
    # The loop ran the merged policy from then on, and only then.
    reserves = {s.at: s.policy.prod_pool.reserve_ratio for s in spy.states}
    assert {r for t, r in reserves.items() if t <= merged_at} == {0.1}
    assert {r for t, r in reserves.items() if t > merged_at} == {0.15}
    assert _evictions_after(untuned, merged_at) > 5.0
    assert _evictions_after(tuned, merged_at) < _evictions_after(untuned, merged_at)
    assert proposal.before is not None and proposal.after is not None
    assert proposal.after.evictions_per_minute < proposal.before.evictions_per_minute
    assert proposal.after.end_s == len(tuned.series.t) * tuned.step_s


def test_idle_production_with_queued_flex_widens_the_hpa_bound_and_flex_grows_into_it() -> None:
    """Production idle, a flex backlog queued and its HPA at an explicit maxReplicas (8) with
    GPUs to spare: the real idle-flex-demand rule proposes max_replicas 8 -> 10, and after the
    merge the replay's HPA (rebuilt from the merged policy) lets flex past 8 replicas."""
    shipped, hours = load_policy(), 1.5
    policy = shipped.model_copy(
        update={"workloads": [shipped.workloads[0].model_copy(update={"max_replicas": 8})]}
    )
    trace = ProductionTrace("idle", 0.0, 60.0, np.full(90, 10, dtype=np.int64), np.full(90, 5.0))
    loop = TunerLoop(TunerConfig(), _models(policy))
    replay = _replay(policy, trace, hours, loop)
    first = loop.run(replay).proposals[0]
    assert first.rule == "idle-flex-demand" and first.outcome == "applied"
    assert [(c.field, c.before, c.after) for c in first.changes] == [
        ("workloads.0.max_replicas", 8, 10)
    ]
    assert first.decided_at_s is not None
    t = np.asarray(replay.series.t)
    flex = np.asarray(replay.series.flex_gpus)
    assert flex[t <= first.decided_at_s].max() == 8
    assert flex[t > first.decided_at_s].max() == 10


def _steady(hours: float) -> ProductionTrace:
    """80 production pods at half duty: production keeps 40 of the 96 GPUs busy (0.42,
    between the grow and shed thresholds), 16 of its pods on gpu-flex."""
    n = int(hours * 60)
    return ProductionTrace("steady", 0.0, 60.0, np.full(n, 80, dtype=np.int64), np.full(n, 40.0))


def test_the_recorded_values_are_the_replays() -> None:
    """Each series' newest sample, worked out by hand for steady production and a light
    stream of requests sharing 90 % of their prompt; the eviction rate against the replay's
    own count of preemptions in the rate window at every evaluation of the waves."""
    policy, hours = load_policy(), 1.0
    spy = Spy(TunerLoop(TunerConfig(), _models(policy)))
    _replay(policy, _steady(hours), hours, spy, requests=_prefix_stream(hours, 2.0, 900))
    last = spy.states[-1]
    snapshot = spy.loop.snapshot(last.at)

    def newest(name: str) -> list[float]:
        return [s.samples[-1][1] for s in snapshot.series[name] if s.samples[-1][0] == last.at]

    assert newest(catalogue.PRODUCTION_GPU_UTILIZATION) == [pytest.approx(40 / 96)]
    assert newest(catalogue.PROD_PODS_PENDING) == [0.0]
    # gpu-flex: 96 - 80 production - 1 flex = 15 unallocated, less gpu-prod's reserve
    # floor(64 x 0.2); gpu-prod (lending) is full of production: nothing beyond its reserve.
    assert newest(catalogue.FLEX_HEADROOM_GPUS) == [3.0, 0.0]
    assert newest(catalogue.FLEX_HPA_AT_MAX) == [0.0]  # one replica of what the pools hold
    assert newest(catalogue.VLLM_QUEUE_DEPTH) == [0.0]  # one request every 2 s
    assert newest(catalogue.KV_CACHE_HIT_RATE) == [pytest.approx(0.9)]
    (usage,) = newest(catalogue.KV_CACHE_USAGE)
    assert 0 < usage < 0.01
    rows = snapshot.series[catalogue.FLEX_EVICTIONS]
    assert len(rows) == len(canonical_reasons(policy))
    assert {v for s in rows for _, v in s.samples} == {0.0}

    storm = _storm_policy(0.1)
    spy = Spy(TunerLoop(TunerConfig(), _models(storm)))
    replay = _replay(storm, _waves(1), 1, spy)
    at = spy.states[-1].at
    t, evictions = np.asarray(replay.series.t), np.asarray(replay.series.evictions)
    window_s = duration_seconds(storm.metrics.rate_window)
    by_reason = split(spy.loop.snapshot(at), catalogue.FLEX_EVICTIONS, (REASON_LABEL,))
    preempted = by_reason[("preemption",)].samples
    assert len(preempted) == 60 and max(v for _, v in preempted) > 5
    for when, value in preempted:
        counted = evictions[(t > when - window_s) & (t <= when)].sum()
        assert value == pytest.approx(counted / (window_s / 60)), when
    assert {v for key, w in by_reason.items() if key != ("preemption",) for v in w.values} == {0}


def test_quiet_production_gets_no_proposal_and_changes_nothing() -> None:
    """Production steady between the thresholds, no eviction, flex within its bound, a high
    hit rate: every rule decides nothing, and the replay is the replay without the tuner."""
    policy, hours = load_policy(), 1.0
    requests = _prefix_stream(hours, 2.0, 900)
    loop = TunerLoop(TunerConfig(), _models(policy))
    tuned = _replay(policy, _steady(hours), hours, loop, requests=requests)
    run = loop.run(tuned)
    assert run.cycles == 11 and run.proposals == ()
    assert {n.split(":")[0] for n in run.last_noops} == {
        "eviction-storm",
        "kv-hit-rate",
        "idle-flex-demand",
    }
    untuned = _replay(policy, _steady(hours), hours, requests=requests)
    assert summarize(tuned, policy) == summarize(untuned, policy)


def test_a_storm_with_every_lever_at_its_bound_gets_no_proposal() -> None:
    """The same waves with the reserve already at the tuner's bound (reserve_ratio_max) and
    production far from the shed threshold: the storm is seen, no lever is left, the rule
    names the bound for a person, and the replay runs as without the tuner."""
    policy, hours = _storm_policy(0.1), 1.5
    settings = TunerSettings(reserve_ratio_max=0.1)
    loop = TunerLoop(TunerConfig(settings), _models(policy))
    tuned = _replay(policy, _waves(hours), hours, loop)
    run = loop.run(tuned)
    assert run.proposals == ()
    (storm,) = [n for n in run.last_noops if n.startswith("eviction-storm:")]
    assert "reserve_ratio 0.1 is at its bound (reserve_ratio_max 0.1)" in storm
    assert summarize(tuned, policy) == summarize(_replay(policy, _waves(hours), hours), policy)


def test_a_proposal_still_in_review_when_the_replay_ends_changes_nothing() -> None:
    """A review longer than the replay: the proposal is listed as in review, never merged."""
    policy, hours = _storm_policy(0.1), 1.0
    loop = TunerLoop(TunerConfig(review_delay_s=4 * 3600), _models(policy))
    tuned = _replay(policy, _waves(hours), hours, loop)
    (proposal,) = loop.run(tuned).proposals
    assert proposal.outcome == "in review" and proposal.decided_at_s is None
    assert proposal.review_due_s == proposal.proposed_at_s + 4 * 3600
    assert proposal.before is None and proposal.after is None
    assert summarize(tuned, policy) == summarize(_replay(policy, _waves(hours), hours), policy)


def test_a_merge_is_validated_again_and_sizes_the_vllm_plan() -> None:
    """The merge re-validates against the policy then in force: a stale "before" (another
    merge came first) and a broken invariant are refused with the reason; a KV share change
    re-sizes the workload's KV tokens as the vLLM plan does."""
    policy = load_policy()
    models = _models(policy)
    shed = ("elastic", "shed_while_production_above")
    stale = merge(policy, [Change(shed, 0.7, 0.6)], models)
    assert isinstance(stale, str) and "is 0.65 in the policy now" in stale
    broken = merge(policy, [Change(shed, 0.65, 0.3)], models)
    assert isinstance(broken, str) and "does not validate" in broken
    assert "grow_while_production_below" in broken
    share = ("kv_cache", "max_gpu_memory_share")
    retune = merge(policy, [Change(share, 0.75, 0.8)], models)
    assert isinstance(retune, Retune)
    w = policy.workloads[0]
    assert retune.policy.kv_cache.max_gpu_memory_share == 0.8
    want = plan_kv_cache(retune.policy, w, models[w.name]).max_concurrent_tokens
    assert retune.kv_tokens[w.name] == want
    assert want > plan_kv_cache(policy, w, models[w.name]).max_concurrent_tokens


def _seeded(seed: int) -> tuple[TunerRun, object]:
    policy, hours = _storm_policy(0.1), 1.5
    loop = TunerLoop(TunerConfig(), _models(policy))
    replay = _replay(policy, _waves(hours, seed), hours, loop)
    return loop.run(replay), summarize(replay, policy)


def test_the_tuned_replay_is_a_function_of_its_seed() -> None:
    """Same seed, same proposals at the same times with the same texts and figures; another
    seed, another replay."""
    run, summary = _seeded(3)
    assert run.proposals, "the jittered waves still storm"
    again, summary_again = _seeded(3)
    assert asdict(again) == asdict(run) and summary_again == summary
    other, other_summary = _seeded(4)
    assert (asdict(other), other_summary) != (asdict(run), summary)


def test_whatif_tuner_writes_its_section_everywhere_and_refuses_bad_options(
    tmp_path: Path,
) -> None:
    """``gpupool whatif --tuner``: the console, the JSON (``tuner``) and the markdown list the
    cycles (one every 5 m of the hour after the first, 11) and the last cycle's reasons; a
    bad review delay, review options without ``--tuner`` and a bad settings file are one
    line each, before anything runs."""
    from typer.testing import CliRunner

    from runtime.cli.app import app

    runner = CliRunner()
    out = tmp_path / "out"
    settings = tmp_path / "tuner.yaml"
    settings.write_text("cooldown: 2h\n")
    result = runner.invoke(
        app,
        [
            "whatif",
            "--hours",
            "1",
            "--tuner",
            "--tuner-settings",
            str(settings),
            "--review-delay",
            "30m",
            "--json",
            str(out / "r.json"),
            "--markdown",
            str(out / "r.md"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Tuner in the loop: 11 cycles" in result.output
    tuner = json.loads((out / "r.json").read_text())["tuner"]
    assert (tuner["cycles"], tuner["interval_s"], tuner["review_delay_s"]) == (11, 300, 1800)
    assert tuner["proposals"] == [] and len(tuner["last_noops"]) >= 1
    text = (out / "r.md").read_text()
    assert "Tuner in the loop: 11 cycles" in text and "merged 1800 s after" in text
    assert "tuner in the pooled loop: decisions.decide every 5m" in text  # assumptions
    for args, message in [
        (["--tuner", "--review-delay", "soon"], "--review-delay: expected a Prometheus duration"),
        (["--review-delay", "5m"], "--tuner-settings and --review-delay need --tuner"),
        (["--tuner", "--tuner-settings", str(tmp_path / "none.yaml")], "file not found"),
    ]:
        bad = runner.invoke(app, ["whatif", "--hours", "0.1", *args, "--json", str(out / "b")])
        assert bad.exit_code == 1 and message in bad.output, bad.output
        assert "Traceback" not in bad.output and not (out / "b").exists()
