"""Every catalogue query on backfilled data with answers worked out by hand.

The OpenMetrics file is written here, loaded with ``promtool tsdb create-blocks-from
openmetrics`` (timestamps in seconds, ends with ``# EOF``) into a real Prometheus, and each
recording rule's expression is evaluated with ``time=`` inside the data.

Cluster (test policy: pools gpu-prod = node n1, gpu-flex = node n2, 2 GPUs each; workload
``llm`` 1 GPU per replica, 2 replicas; grow below 0.35, shed above 0.65, idle GPU below 0.30):

| phase (minutes) | n1 GPU % | n2 GPU % | cluster | flex idle GPUs | budget |
|---|---|---|---|---|---|
| grow  0-10 | 20, 20 | 10, 50 | 0.25  | 1 | 2 + 1 = 3 |
| hold 10-20 | 50, 50 | 40, 40 | 0.45  | 0 | 2         |
| shed 20-30 | 90, 90 | 70, 20 | 0.675 | 1 | 2 - 1 = 1 |
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from policy import PoolPolicy, parse_policy
from runtime.metrics import catalogue as c
from tests.alerts.test_e2e import query
from tests.harness.servers import Server, backfill, start_prometheus

T0 = 1_700_000_000
STEP_S = 30
END_S = 30 * 60
GROW, HOLD, SHED = T0 + 8 * 60, T0 + 18 * 60, T0 + 28 * 60
FLEX = 'namespace="gpupool-flex"'
PROD = "gpupool-production"

Series = dict[str, Callable[[int], float]]
"""Series text (name + labels) -> value at t seconds after T0."""


def _phase(grow: float, hold: float, shed: float) -> Callable[[int], float]:
    return lambda t: grow if t < 600 else hold if t < 1200 else shed


def one(t: int) -> float:
    return 1.0


def _flip_at(minute: int) -> Callable[[int], float]:
    return lambda t: 1.0 if t >= minute * 60 else 0.0


def scenario() -> dict[tuple[str, str], Series]:
    """(family, type) -> series of the cluster in the module docstring."""
    util = {
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"}': _phase(20, 50, 90),
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n1"}': _phase(20, 50, 90),
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n2"}': _phase(10, 40, 70),
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n2"}': _phase(50, 40, 20),
    }
    reasons: Series = {
        f'kube_pod_status_reason{{{FLEX},pod="llm-{m}",reason="Evicted"}}': _flip_at(m)
        for m in (1, 4, 5, 6)
    }
    reasons[f'kube_pod_status_reason{{{FLEX},pod="llm-9",reason="Evicted"}}'] = _flip_at(99)
    ns_llm = f'{FLEX},workload="llm"'
    return {
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"): util,
        ("DCGM_FI_DEV_FB_USED", "gauge"): {
            'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="n1"}': lambda t: 30000
        },
        ("DCGM_FI_DEV_FB_FREE", "gauge"): {
            'DCGM_FI_DEV_FB_FREE{gpu="0",Hostname="n1"}': lambda t: 10000
        },
        ("kube_node_labels", "gauge"): {
            'kube_node_labels{node="n1",label_gpupool_io_pool="gpu-prod"}': lambda t: 1,
            'kube_node_labels{node="n2",label_gpupool_io_pool="gpu-flex"}': lambda t: 1,
        },
        ("kube_deployment_spec_replicas", "gauge"): {
            f'kube_deployment_spec_replicas{{{FLEX},deployment="llm"}}': lambda t: 2,
        },
        ("kube_pod_status_reason", "gauge"): reasons,
        ("kube_pod_status_phase", "gauge"): {
            **{
                f'kube_pod_status_phase{{{FLEX},pod="llm-r{i}",phase="Running"}}': lambda t: 1
                for i in range(3)
            },
            'kube_pod_status_phase{namespace="prod",pod="api-0",phase="Pending"}': lambda t: 1,
            'kube_pod_status_phase{namespace="prod",pod="api-1",phase="Pending"}': lambda t: 1,
            'kube_pod_status_phase{namespace="prod",pod="api-2",phase="Pending"}': lambda t: 0,
            'kube_pod_status_phase{namespace="batch",pod="train-0",phase="Pending"}': lambda t: 1,
        },
        ("kube_pod_info", "gauge"): {
            **{
                f'kube_pod_info{{namespace="prod",pod="api-{i}",priority_class="{PROD}"}}': one
                for i in range(3)
            },
            'kube_pod_info{namespace="batch",pod="train-0",priority_class="gpupool-training"}': one,
        },
        ("vllm:kv_cache_usage_perc", "gauge"): {
            f'vllm:kv_cache_usage_perc{{{ns_llm},pod="a",engine="0"}}': lambda t: 0.3,
            f'vllm:kv_cache_usage_perc{{{ns_llm},pod="a",engine="1"}}': lambda t: 0.6,
        },
        ("vllm:prefix_cache_queries", "counter"): {
            f'vllm:prefix_cache_queries_total{{{ns_llm},pod="a",engine="0"}}': lambda t: 20.0 * t,
            f'vllm:prefix_cache_queries_total{{{ns_llm},pod="idle",engine="0"}}': lambda t: 0,
        },
        ("vllm:prefix_cache_hits", "counter"): {
            f'vllm:prefix_cache_hits_total{{{ns_llm},pod="a",engine="0"}}': lambda t: 15.0 * t,
            f'vllm:prefix_cache_hits_total{{{ns_llm},pod="idle",engine="0"}}': lambda t: 0,
        },
        ("vllm:num_preemptions", "counter"): {
            f'vllm:num_preemptions_total{{{ns_llm},pod="a",engine="0"}}': lambda t: 0.1 * t,
        },
        ("vllm:num_requests_waiting", "gauge"): {
            f'vllm:num_requests_waiting{{{ns_llm},pod="a",engine="0"}}': lambda t: 2,
            f'vllm:num_requests_waiting{{{ns_llm},pod="b",engine="0"}}': lambda t: 5,
        },
    }


def openmetrics() -> str:
    lines: list[str] = []
    for (family, kind), series in scenario().items():
        lines.append(f"# TYPE {family} {kind}")
        for name, value in series.items():
            lines += [f"{name} {value(t)} {T0 + t}" for t in range(0, END_S + 1, STEP_S)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("backfill")
    data = workdir / "data"
    backfill(openmetrics(), workdir, data)
    server = start_prometheus(json.dumps({"global": {}}), workdir / "prom", data_dir=data)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def catalogue(test_policy: PoolPolicy) -> c.Catalogue:
    return c.build_catalogue(test_policy)


def values(prom: Server, expr: str, at: int) -> dict[str, float]:
    """``{sorted label pairs: value}`` of an instant query at ``at``, to 12 decimals."""
    return {
        ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): round(
            float(r["value"][1]), 12
        )
        for r in query(prom, expr, at=at)
    }


@pytest.mark.slow
def test_gpu_queries(backfilled: Server, catalogue: c.Catalogue) -> None:
    q = catalogue.query
    assert values(backfilled, q(c.CLUSTER_GPU_UTILIZATION), GROW) == {"": 0.25}
    assert values(backfilled, q(c.CLUSTER_GPU_UTILIZATION), SHED) == {"": 0.675}
    assert values(backfilled, q(c.POOL_GPU_UTILIZATION), GROW) == {
        "pool=gpu-prod": 0.2,
        "pool=gpu-flex": 0.3,
    }
    per_gpu = values(backfilled, q(c.GPU_UTILIZATION), GROW)
    assert per_gpu["Hostname=n2,gpu=0,node=n2,pool=gpu-flex"] == 0.1
    assert len(per_gpu) == 4
    assert values(backfilled, q(c.GPU_MEMORY_USED), GROW) == {"Hostname=n1,gpu=0": 0.75}


@pytest.mark.slow
@pytest.mark.parametrize(("at", "headroom", "budget"), [(GROW, 1, 3), (HOLD, 0, 2), (SHED, 1, 1)])
def test_headroom_and_budget_follow_the_hysteresis_band(
    backfilled: Server, catalogue: c.Catalogue, at: int, headroom: float, budget: float
) -> None:
    assert values(backfilled, catalogue.query(c.FLEX_HEADROOM_GPUS), at) == {
        "pool=gpu-flex": headroom
    }
    assert values(backfilled, catalogue.query(c.FLEX_GPU_BUDGET), at) == {"workload=llm": budget}


@pytest.mark.slow
def test_flex_reserve_is_kept_out_of_headroom(backfilled: Server, test_policy: PoolPolicy) -> None:
    document = test_policy.model_dump(by_alias=True, mode="json")
    document["node_pools"][1]["reserve_ratio"] = 0.5  # 2 GPUs: floor(1) kept back
    reserved = c.build_catalogue(parse_policy(document))
    assert values(backfilled, reserved.query(c.FLEX_HEADROOM_GPUS), GROW) == {"pool=gpu-flex": 0}


@pytest.mark.slow
def test_budget_is_absent_without_utilization_data(
    backfilled: Server, catalogue: c.Catalogue
) -> None:
    """Fail closed: past the data the budget has no series (the HPA holds), never a number."""
    assert values(backfilled, catalogue.query(c.FLEX_GPU_BUDGET), T0 + END_S + 600) == {}


@pytest.mark.slow
def test_vllm_queries(backfilled: Server, catalogue: c.Catalogue) -> None:
    q, pod_a = catalogue.query, "namespace=gpupool-flex,pod=a,workload=llm"
    assert values(backfilled, q(c.KV_CACHE_USAGE), GROW) == {pod_a: 0.6}
    hit = values(backfilled, q(c.KV_CACHE_HIT_RATE), GROW)
    assert hit.keys() == {pod_a}, "the instance without queries must have no hit rate"
    assert hit[pod_a] == pytest.approx(0.75, rel=1e-12)
    assert values(backfilled, q(c.VLLM_PREEMPTIONS), GROW)[pod_a] == pytest.approx(0.1)
    assert values(backfilled, q(c.VLLM_QUEUE_DEPTH), GROW) == {
        "namespace=gpupool-flex,workload=llm": 7
    }


@pytest.mark.slow
def test_kube_state_queries(backfilled: Server, catalogue: c.Catalogue) -> None:
    q = catalogue.query
    # Window [3m, 8m]: pods flipping at 4, 5 and 6 minutes; llm-1 flipped before it.
    assert values(backfilled, q(c.FLEX_EVICTIONS), GROW) == {"namespace=gpupool-flex": 0.6}
    assert values(backfilled, q(c.FLEX_EVICTIONS), HOLD) == {"namespace=gpupool-flex": 0}
    assert values(backfilled, q(c.PROD_PODS_PENDING), GROW) == {"": 2}
    assert values(backfilled, q(c.FLEX_PODS_RUNNING), GROW) == {"": 3}


def test_every_catalogue_query_is_checked_here(catalogue: c.Catalogue) -> None:
    source = Path(__file__).read_text()
    for record in catalogue:
        constant = next(k for k, v in vars(c).items() if v == record.record and k.isupper())
        assert f"c.{constant}" in source, f"{record.record} has no backfill check"
