"""The replay's budget equals the catalogue's PromQL on a real Prometheus.

A pooled replay (diurnal production that crosses both thresholds, a flex backlog) hands its
exporter states to ``observe``; a sample of them is written as dcgm-exporter and
kube-state-metrics series (one state per minute), loaded with ``promtool tsdb
create-blocks-from openmetrics``, and the catalogue's ``gpupool:flex_gpu_budget`` and
headroom expressions are evaluated at each state's minute. Both policies are tried: the
default and one with a flex reserve, so the reserve floor is exercised too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from policy import PoolPolicy, load_policy, parse_policy
from runtime.metrics import catalogue as c
from runtime.sim.budget import ExporterView, budget, headroom
from runtime.sim.engine import FlexInput, Layout, Settings, replay_pooled
from runtime.sim.serving import Requests
from runtime.sim.traces import diurnal
from tests.alerts.test_e2e import query
from tests.harness.servers import Server, backfill, start_prometheus

T0 = 1_750_000_000
STATES = 48


class Latencies:
    """Fixed step latencies: the budget does not depend on how fast flex serves."""

    def prefill_s(self, tokens: object) -> np.ndarray:
        return np.asarray(tokens, dtype=np.float64) * 2e-5

    def decode_step_s(self, batch: object, context: object) -> np.ndarray:
        return np.asarray(0.01 + 0.0 * np.asarray(batch, dtype=np.float64))


def _policies() -> dict[str, PoolPolicy]:
    default = load_policy()
    document = default.model_dump(mode="json")
    document["node_pools"][1]["reserve_ratio"] = 0.3  # 32 GPUs x 0.3 = 9.6: the floor matters
    return {"default": default, "reserve": parse_policy(document)}


def _states(policy: PoolPolicy) -> list[ExporterView]:
    """Exporter states the replay evaluated its budget on, evenly sampled."""
    seen: list[ExporterView] = []
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
    trace = diurnal(hours=24, peak_gpus=90, trough_gpus=2, duty_cycle=0.95, seed=3)
    replay_pooled(
        policy,
        Layout.of_policy(policy),
        trace,
        [FlexInput(w, requests, 200_000, Latencies(), backlog_window=4096)],
        Settings(hours=24, flex_startup_s=120),
        prod_tokens_per_gpu_s=1.0,
        observe=lambda _t, view: seen.append(view),
    )
    # Stratified: a third from each side of the band and inside it; within a region the
    # states with the most flex replicas first (where a wrong step shows), then spread in time.
    e = policy.elastic
    by_region: dict[str, list[ExporterView]] = {"grow": [], "hold": [], "shed": []}
    for view in seen:
        u = view.cluster_utilization()
        assert u is not None
        region = "grow" if u < e.scale_up_below else "shed" if u > e.shed_above else "hold"
        by_region[region].append(view)
    picked: list[ExporterView] = []
    for views in by_region.values():
        ranked = sorted(views, key=lambda v: -sum(v.spec_replicas.values()))
        picked += ranked[: STATES // 6]
        spread = np.linspace(0, len(views) - 1, STATES // 6).round().astype(int) if views else []
        picked += [views[i] for i in spread]
    return picked


def _openmetrics(policy: PoolPolicy, states: list[ExporterView]) -> str:
    label = c.ksm_label(policy.cluster.pool_label)
    gpu_lines, node_lines, replica_lines = [], [], []
    nodes: set[tuple[str, str]] = set()
    for k, view in enumerate(states):
        t = T0 + 60 * k
        for pool, util in view.gpu_util_pct.items():
            per_node = next(p.gpus_per_node for p in policy.node_pools if p.name == pool)
            for i, value in enumerate(util):
                node = f"{pool}-{i // per_node}"
                nodes.add((node, pool))
                gpu_lines.append(
                    f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i % per_node}",'
                    f'{policy.metrics.gpu_node_label}="{node}"}} {float(value)!r} {t}'
                )
        for name, replicas in view.spec_replicas.items():
            replica_lines.append(
                f'kube_deployment_spec_replicas{{namespace="{policy.cluster.flex_namespace}",'
                f'deployment="{name}"}} {replicas} {t}'
            )
    for k in range(len(states)):
        for node, pool in sorted(nodes):
            node_lines.append(f'kube_node_labels{{node="{node}",{label}="{pool}"}} 1 {T0 + 60 * k}')

    # OpenMetrics wants each series' samples together and in time order.
    def grouped(lines: list[str]) -> list[str]:
        return sorted(lines, key=lambda s: (s.rsplit(" ", 2)[0], int(s.rsplit(" ", 1)[1])))

    return "\n".join(
        [
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            *grouped(gpu_lines),
            "# TYPE kube_node_labels gauge",
            *grouped(node_lines),
            "# TYPE kube_deployment_spec_replicas gauge",
            *grouped(replica_lines),
            "# EOF",
            "",
        ]
    )


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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "reserve"])
def test_replay_budget_equals_the_catalogue_promql(
    scenarios: dict[str, tuple[PoolPolicy, list[ExporterView], Server]], name: str
) -> None:
    policy, states, prom = scenarios[name]
    catalogue = c.build_catalogue(policy)
    workload = policy.workloads[0]
    flex_pool = policy.pool_of(workload)
    regions = set()
    for k, view in enumerate(states):
        at = T0 + 60 * k
        expected = budget(policy, workload, view)
        assert _value(prom, catalogue.query(c.FLEX_GPU_BUDGET), at) == expected, (k, view)
        assert _value(prom, catalogue.query(c.FLEX_HEADROOM_GPUS), at) == headroom(
            policy, flex_pool, view
        )
        cluster = view.cluster_utilization()
        assert cluster is not None
        assert _value(prom, catalogue.query(c.CLUSTER_GPU_UTILIZATION), at) == pytest.approx(
            cluster, abs=1e-12
        )
        e = policy.elastic
        regions.add(
            "grow" if cluster < e.scale_up_below else "shed" if cluster > e.shed_above else "hold"
        )
    assert regions == {"grow", "hold", "shed"}, f"the sampled states cover only {regions}"
    shed_with_replicas = [
        v
        for v in states
        if (v.cluster_utilization() or 0) > policy.elastic.shed_above
        and v.spec_replicas[workload.name] > 1
    ]
    assert shed_with_replicas, "no sampled shed state has a replica to shed"
