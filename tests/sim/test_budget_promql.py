"""The replay's budget equals the catalogue's PromQL on a real Prometheus.

A pooled replay (diurnal production that crosses both thresholds, a flex backlog) hands its
exporter states to ``observe``; a sample of them, stratified over the budget's four steps
(reserve shortfall, shed, grow, hold), is written as the kube-state-metrics and dcgm-exporter
series those exporters would publish, loaded with ``promtool tsdb create-blocks-from
openmetrics``, and the catalogue's spare, production-utilization, headroom and budget
expressions are evaluated at each state's instant, standalone and as the budget's chain of
recording rules records them (``promtool tsdb create-blocks-from rules``, a pass per
level). Four policies are tried: the default (gpu-prod lends), the same with lending off,
one with a flex reserve (so the floor of each pool's reserve is exercised too), and one
with a reserve in production replica slots, a second flex pool and 4-GPU production pods
beside 1-GPU flex pods on lending nodes (so free GPUs are fragmented and slots go missing).

Without an observer the replay's budget reads the cluster's counters (``exporter_view.Tallies``)
instead of the view; every replay here checks the two equal at each evaluation.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from alerts import recording
from policy import DEFAULT_POLICY, PoolPolicy, load_policy, parse_policy
from runtime.cli.app import app
from runtime.metrics import catalogue as c
from runtime.sim.budget import (
    ExporterView,
    budget,
    headroom,
    held,
    production_demanded,
    production_utilization,
    reserve,
    spare,
)
from runtime.sim.engine import replay_pooled
from runtime.sim.exporter_view import Tallies
from runtime.sim.pooled_loop import PooledLoop
from runtime.sim.production import ProductionRule
from runtime.sim.replay_model import FlexInput, Layout, Observer, Series, Settings
from runtime.sim.request_stream import Requests
from runtime.sim.traces import ProductionTrace, diurnal, load_production_trace
from runtime.tuner import prometheus as prometheus_edge
from tests.alerts.test_e2e import query
from tests.harness.servers import Server, backfill, backfill_rules, start_prometheus

T0 = 1_750_000_000
STATES = 48
SPACING_S = 600


class Latencies:
    """Fixed step latencies: the budget does not depend on how fast flex serves."""

    def prefill_s(self, tokens: object) -> np.ndarray:
        return np.asarray(tokens, dtype=np.float64) * 2e-5

    def decode_step_s(self, batch: object, context: object) -> np.ndarray:
        return np.asarray(0.01 + 0.0 * np.asarray(batch, dtype=np.float64))


def _policies() -> dict[str, PoolPolicy]:
    default = load_policy()
    assert default.lending_pools, "the shipped example lends gpu-prod"
    document = default.model_dump(mode="json")
    document["node_pools"][0]["lend_idle"] = False
    lending_off = parse_policy(document)
    document = default.model_dump(mode="json")
    document["node_pools"][1]["reserve_ratio"] = 0.3  # 32 GPUs x 0.3 = 9.6: the floor matters
    document["elastic"]["shed_while_production_above"] = 0.5  # production crosses it often
    document["workloads"][0]["max_replicas"] = 32  # >= 10 replicas: HPA steps of 2 and more
    document["production"] = []  # the replay's production follows the trace
    reserve = parse_policy(document)
    document = default.model_dump(mode="json")
    document["node_pools"][0]["reserve_ratio"] = 0.0
    document["node_pools"][0]["reserve"] = {"replicas": 3, "of": "inference/llama-70b-prod"}
    second = {**document["node_pools"][1], "name": "gpu-flex-b", "max_nodes": 1, "nodes": []}
    document["node_pools"].append(second)
    document["node_pools"][1]["max_nodes"] = 1
    document["elastic"]["shed_while_production_above"] = 0.5
    slots = parse_policy(document)
    return {"default": default, "lending-off": lending_off, "reserve": reserve, "slots": slots}


Region = str


def _region(policy: PoolPolicy, view: ExporterView) -> Region:
    """Which of the budget's four steps the state takes (the same order as the query)."""
    room, prod, e = spare(policy, view), production_utilization(policy, view), policy.elastic
    assert room is not None
    if room < 0:
        return "shortfall"
    if prod is not None and prod > e.shed_while_production_above:
        return "shed"
    if prod is not None and prod < e.grow_while_production_below:
        return "grow"
    return "hold"


Replay = tuple[PoolPolicy, Layout, ProductionTrace, list[FlexInput], Settings]


def _replays(policy: PoolPolicy) -> Iterator[Replay]:
    """The pooled replays whose exporter states are checked."""
    w = policy.workloads[0]
    n = 64
    requests = Requests(
        np.zeros(n),
        np.full(n, 1000, dtype=np.int64),
        np.full(n, 200, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        backlog=True,
    )
    # Production peaks beyond the cluster's 96 GPUs at 90 % duty per one-GPU replica: every
    # step of the budget is taken, and production and flex pods both wait at times. The
    # policy's own production workloads (multi-GPU pods under their HPA) add their states.
    trace = diurnal(hours=24, peak_gpus=120, trough_gpus=2, duty_cycle=0.95, seed=3)
    flex = [FlexInput(w, requests, 200_000, Latencies(), backlog_window=4096)]
    for rule in (ProductionRule("duty", target_utilization=0.9), ProductionRule("policy")):
        settings = Settings(hours=24, flex_startup_s=120, production=rule)
        yield policy, Layout.of_policy(policy), trace, flex, settings


def _states(policy: PoolPolicy) -> list[ExporterView]:
    """Exporter states the replay evaluated its budget on, stratified by the step taken."""
    seen: list[ExporterView] = []
    for replay in _replays(policy):
        _replay_checked(replay, lambda _t, view: seen.append(view))
    # A quarter from each step; within a step the states with the most pods first (where a
    # wrong term shows), then spread in time.
    by_region: dict[Region, list[ExporterView]] = {}
    for view in seen:
        by_region.setdefault(_region(policy, view), []).append(view)
    picked: list[ExporterView] = []
    for views in by_region.values():
        ranked = sorted(views, key=lambda v: -len(v.pods))
        picked += ranked[: STATES // 8]
        spread = np.linspace(0, len(views) - 1, STATES // 8).round().astype(int)
        picked += [views[i] for i in spread]
    short = [v for v in seen if _slots_short(policy, v)]
    picked += short[:: max(1, len(short) // (STATES // 8))][: STATES // 8]
    return picked


def _slots_short(policy: PoolPolicy, view: ExporterView) -> bool:
    """A pool with a slot reserve has the GPUs of a slot free, but on no single node enough
    of them to hold all its slots: the budget's fragmentation term decides."""
    for pool in policy.node_pools:
        reserve = policy.reserve_of(pool)
        free = view.unallocated({pool.name}).values()
        slots = sum(f // reserve.slot_gpus for f in free)
        if reserve.slots and sum(free) >= reserve.slot_gpus and slots < reserve.slots:
            return True
    return False


PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _openmetrics(policy: PoolPolicy, states: list[ExporterView]) -> str:
    """The states as kube-state-metrics and dcgm-exporter series, one state every
    ``SPACING_S`` (beyond the 5 m lookback, so a pod gone in the next state leaves no trace)."""
    label = c.ksm_label(policy.cluster.pool_label)
    gpu_label, resource = policy.metrics.gpu_node_label, policy.metrics.gpu_resource
    ns_label, pod_label = policy.metrics.gpu_pod_labels
    prod_class = policy.priorities.production.name
    series: dict[str, list[str]] = {}

    def add(family: str, labels: str, value: float, t: int) -> None:
        series.setdefault(family, []).append(f"{family}{{{labels}}} {float(value)!r} {t}")

    for k, view in enumerate(states):
        t = T0 + SPACING_S * k
        gpus_used: dict[str, int] = {}
        for node in view.nodes:
            if node.pool is not None:
                add("kube_node_labels", f'node="{node.name}",{label}="{node.pool}"', 1, t)
            add(
                "kube_node_status_allocatable",
                f'node="{node.name}",resource="{resource}",unit="integer"',
                node.allocatable,
                t,
            )
            add("kube_node_spec_unschedulable", f'node="{node.name}"', 0, t)
            add(
                "kube_node_status_condition",
                f'node="{node.name}",condition="Ready",status="true"',
                int(node.schedulable),
                t,
            )
        for pod in view.pods:
            who = f'namespace="{pod.namespace}",pod="{pod.name}"'
            for phase in PHASES:
                add("kube_pod_status_phase", f'{who},phase="{phase}"', int(phase == pod.phase), t)
            klass = prod_class if pod.production else policy.priorities.idle_inference.name
            add("kube_pod_info", f'{who},priority_class="{klass}"', 1, t)
            bound = f',node="{pod.node}"' if pod.node else ""
            add(
                "kube_pod_container_resource_requests",
                f'{who},container="vllm"{bound},resource="{resource}",unit="integer"',
                pod.gpus,
                t,
            )
            if pod.terminating:
                add("kube_pod_deletion_timestamp", who, t - 10, t)
            if pod.node is not None:
                assert pod.util_pct is not None
                for _ in range(pod.gpus):
                    gpu = gpus_used.get(pod.node, 0)
                    gpus_used[pod.node] = gpu + 1
                    add(
                        "DCGM_FI_DEV_GPU_UTIL",
                        f'gpu="{gpu}",{gpu_label}="{pod.node}",'
                        f'{ns_label}="{pod.namespace}",{pod_label}="{pod.name}"',
                        pod.util_pct,
                        t,
                    )
        for node in view.nodes:
            for gpu in range(gpus_used.get(node.name, 0), node.allocatable):
                add("DCGM_FI_DEV_GPU_UTIL", f'gpu="{gpu}",{gpu_label}="{node.name}"', 0, t)
        for name, replicas in view.spec_replicas.items():
            add(
                "kube_deployment_spec_replicas",
                f'namespace="{policy.cluster.flex_namespace}",deployment="{name}"',
                replicas,
                t,
            )

    # OpenMetrics wants each series' samples together and in time order.
    def grouped(lines: list[str]) -> list[str]:
        return sorted(lines, key=lambda s: (s.rsplit(" ", 2)[0], int(s.rsplit(" ", 1)[1])))

    out: list[str] = []
    for family, lines in sorted(series.items()):
        out += [f"# TYPE {family} gauge", *grouped(lines)]
    return "\n".join([*out, "# EOF", ""])


@pytest.fixture(scope="module")
def scenarios(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[PoolPolicy, list[ExporterView], Server]]]:
    out: dict[str, tuple[PoolPolicy, list[ExporterView], Server]] = {}
    try:
        for name, policy in _policies().items():
            workdir = tmp_path_factory.mktemp(f"budget-{name}")
            states = _states(policy)
            data = workdir / "data"
            backfill(_openmetrics(policy, states), workdir, data)
            rules = recording.budget_groups(policy, c.build_catalogue(policy))
            end = T0 + SPACING_S * len(states)
            backfill_rules(rules, T0, end, workdir / "rules", data, interval_s=SPACING_S)
            server = start_prometheus(json.dumps({"global": {}}), workdir / "prom", data_dir=data)
            out[name] = (policy, states, server)
        yield out
    finally:
        for *_, server in out.values():
            server.stop()


def _value(prom: Server, expr: str, at: int) -> float | None:
    result = query(prom, expr, at=at)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def recorded(record: str) -> str:
    """``record`` as the rules recorded it in a state's period (they ran once in it), read
    at the period's last second."""
    return f"last_over_time({record}[{SPACING_S - 1}s])"


def _by_pool(prom: Server, expr: str, at: int) -> dict[str, float]:
    return {r["metric"]["pool"]: float(r["value"][1]) for r in query(prom, expr, at=at)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "lending-off", "reserve", "slots"])
def test_replay_budget_equals_the_catalogue_promql(
    scenarios: dict[str, tuple[PoolPolicy, list[ExporterView], Server]], name: str
) -> None:
    policy, states, prom = scenarios[name]
    catalogue = c.build_catalogue(policy)
    workload = policy.workloads[0]
    regions = set()
    for k, view in enumerate(states):
        at = T0 + SPACING_S * k
        assert _value(prom, catalogue.query(c.SPARE_GPUS), at) == spare(policy, view), k
        assert _value(prom, catalogue.query(c.PRODUCTION_GPU_UTILIZATION), at) == pytest.approx(
            production_utilization(policy, view), abs=1e-12
        ), k
        assert _value(prom, catalogue.query(c.PRODUCTION_GPUS_DEMANDED), at) == (
            production_demanded(view)
        ), k
        busy = view.production_busy()
        assert _value(prom, catalogue.query(c.PRODUCTION_BUSY_GPUS), at) == (
            None if busy is None else pytest.approx(busy, abs=1e-9)
        ), k
        expected_room = {p.name: headroom(policy, p, view) for p in policy.harvest_pools}
        room = _by_pool(prom, catalogue.query(c.FLEX_HEADROOM_GPUS), at)
        assert room == {p: v for p, v in expected_room.items() if v is not None}, k
        expected = budget(policy, workload, view)
        assert _value(prom, catalogue.query(c.FLEX_GPU_BUDGET), at) == expected, (k, view)
        # the rules as Prometheus records them, each term reading the ones before it: the
        # one evaluation of each state's period
        end = at + SPACING_S - 1
        assert _value(prom, recorded(c.FLEX_GPU_BUDGET), end) == expected, (k, view)
        assert _value(prom, recorded(c.SPARE_GPUS), end) == spare(policy, view), k
        assert _by_pool(prom, recorded(c.FLEX_HEADROOM_GPUS), end) == room, k
        regions.add(_region(policy, view))
    assert regions == {"shortfall", "shed", "grow", "hold"}, f"states cover only {regions}"
    assert any(p.node is None and not p.production for v in states for p in v.pods), (
        "no sampled state has a pending flex pod"
    )
    assert any(p.terminating for v in states for p in v.pods), "no terminating pod sampled"
    if name == "reserve":
        assert max(v.spec_replicas[workload.name] for v in states) >= 10, "no HPA step > 1"
    prod_nodes = {n.name for v in states for n in v.nodes if n.pool == policy.prod_pool.name}
    lent = any(p.node in prod_nodes and not p.production for v in states for p in v.pods)
    if not policy.lending_pools:
        assert not lent, "flex on production's nodes although no pool lends"
    elif name in ("default", "slots"):
        assert lent, "no sampled state has flex on a lending node"
    if name == "slots":
        assert any(_slots_short(policy, v) for v in states), (
            "no sampled state has free GPUs that hold too few whole slots"
        )
    assert any(p.node is None and p.production for v in states for p in v.pods), (
        "no sampled state has a pending production pod"
    )


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["default", "lending-off", "reserve", "slots"])
def test_the_replay_tallies_equal_the_exporter_view(name: str) -> None:
    """Without an observer or a tuner the replay's budget reads ``Tallies`` (the cluster's
    counters), not the exporter view this file proves equal to PromQL: every sum the budget
    takes is the same on every state the replay evaluates (here the duty rule's replay; the
    slow test checks the policy rule's too), and so is the replay (checked where the states
    vary most: two flex pools, a slot reserve, lending)."""
    replay = next(_replays(_policies()[name]))
    series = _replay_checked(replay)
    if name == "slots":
        assert replay_pooled(*replay).series == series


def _replay_checked(replay: Replay, observe: Observer | None = None) -> Series:
    """The replay on the exporter view, checking ``Tallies`` against it at every evaluation
    before ``observe`` sees it."""
    policy, settings = replay[0], replay[-1]
    every = {p.name for p in policy.node_pools}
    seen = 0

    def check(now: float, view: ExporterView) -> None:
        nonlocal seen
        seen += 1
        util = loop.prod_util | loop.flex_util
        tallies = Tallies(loop.cluster, now, util, dict(loop.spec), loop.identity)
        assert tallies.spec_replicas == view.spec_replicas
        for pools in [every, *({p.name} for p in policy.node_pools), set()]:
            assert tallies.schedulable_gpus(pools) == view.schedulable_gpus(pools), pools
            for unit in (1, 2, 3, 4, 8):
                assert tallies.free_gpus(pools, unit) == view.free_gpus(pools, unit), unit
        for production in (True, False, None):
            for namespace in (policy.cluster.flex_namespace, "inference", None):
                kind = {"production": production, "namespace": namespace}
                assert tallies.pending_gpus(**kind) == view.pending_gpus(**kind), kind
        assert tallies.production_busy() == view.production_busy()
        assert spare(policy, tallies) == spare(policy, view)
        assert reserve(policy, tallies) == reserve(policy, view)
        assert production_utilization(policy, tallies) == production_utilization(policy, view)
        for pool in policy.node_pools:
            assert headroom(policy, pool, tallies) == headroom(policy, pool, view)
        for w in policy.workloads:
            assert held(policy, w, tallies) == held(policy, w, view)
            assert budget(policy, w, tallies) == budget(policy, w, view)
        if observe is not None:
            observe(now, view)

    loop = PooledLoop(*replay, observe=check)
    for step in range(settings.steps):
        loop.step(step)
    assert seen == len(range(0, settings.steps, loop.eval_every))
    return loop.series


@pytest.mark.slow
@pytest.mark.parametrize("points", [prometheus_edge.POINTS_PER_QUERY, 7])
def test_the_production_trace_from_range_queries_is_what_the_states_held(
    scenarios: dict[str, tuple[PoolPolicy, list[ExporterView], Server]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    points: int,
) -> None:
    """``gpupool production-trace`` over the backfilled history: one row per state, GPUs
    demanded and duty cycle as the mirror computes them from that state; in one range
    query, and in pieces of 7 steps (a long window's queries), with no step lost or
    repeated where pieces meet."""
    monkeypatch.setattr(prometheus_edge, "POINTS_PER_QUERY", points)
    policy, states, prom = scenarios["default"]
    folder = tmp_path / "policy"
    shutil.copytree(DEFAULT_POLICY.parent / "models", folder / "models")
    (folder / "pool.yaml").write_text(yaml.safe_dump(policy.model_dump(mode="json", by_alias=True)))
    out = tmp_path / "production.csv"
    end = T0 + SPACING_S * (len(states) - 1)
    args = ["production-trace", "--prometheus", prom.url, "--out", str(out), "--policy"]
    args += [str(folder / "pool.yaml"), "--end", str(end)]
    args += ["--window", f"{SPACING_S * (len(states) - 1)}s", "--step", f"{SPACING_S}s"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    trace = load_production_trace(out)
    demanded = [production_demanded(v) for v in states]
    assert trace.held.tolist() == demanded
    duty = [
        (v.production_busy() or 0.0) / d if d else 0.0
        for v, d in zip(states, demanded, strict=True)
    ]
    expected = [d * u for d, u in zip(demanded, duty, strict=True)]
    # the duty cycle is written to 6 decimals: busy to a millionth of the demand
    assert trace.busy.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert max(demanded) > min(demanded), "the states never changed production's demand"
