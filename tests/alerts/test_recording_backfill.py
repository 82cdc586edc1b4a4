"""Every catalogue query on backfilled data with answers worked out by hand.

The OpenMetrics file is written here, loaded with ``promtool tsdb create-blocks-from
openmetrics`` (timestamps in seconds, ends with ``# EOF``) into a real Prometheus, and each
recording rule's expression is evaluated with ``time=`` inside the data, 8 minutes into a
phase (beyond the 5 m lookback of the phase before).

Cluster (test policy: pools gpu-prod and gpu-flex, reserves 0; workload ``llm`` 1 GPU per
replica, ``spec.replicas`` 2; grow below 0.35, shed above 0.65). Nodes, 2 GPUs each: n1
gpu-prod, n2 gpu-flex, n3 unlabelled (not a pool), n4 gpu-flex but cordoned (never counted).
Production pods (``gpupool-production``) in ``prod``; ``llm-6d4cf-x0001`` runs on n2 all along.

| phase (min) | production pods (GPU %) | other | free p/f | spare | prod util | room | budget |
|---|---|---|---|---|---|---|---|
| grow 0-10 | api-0 on n1 (40) | x0002 on n3, deleting | 1 / 1 | 2 | 0.4/4 = 0.1 | 1 | 1 + 1 = 2 |
| hold 10-20 | api-0, api-1 on n1 (100) | x0003 pending | 0 / 1 | 1 | 2/4 = 0.5 | 1-1 = 0 | 1 |
| shed 20-30 | + api-2 on n2 (90) | | 0 / 0 | 0 | 2.9/4 = 0.725 | 0 | 1 - 1 = 0 |
| short 30-40 | api-0, api-1 (50); api-3 waits, 2 GPUs | | 0 / 1 | 1-2 = -1 | 0.25 | 0 | 1 - 1 = 0 |

("free p/f": unallocated GPUs of gpu-prod / gpu-flex; "room": flex headroom; x000N are the
``llm-6d4cf-`` flex pods.)
In "short" production's utilization is in the grow band, but the spare is negative: the
reserve shortfall wins. ``train-0`` (training class, 1 GPU) and ``api-4`` (production, no
GPU) wait unschedulable all along and are not production capacity at risk; ``train-1`` holds
a GPU on n3 without a dcgm series (used by the policy that calls training "production").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alerts import recording
from policy import PoolPolicy, parse_policy
from runtime.metrics import catalogue as c
from tests.alerts.test_e2e import query
from tests.harness.servers import Server, backfill, backfill_rules, start_prometheus

T0 = 1_700_000_000
STEP_S = 30
END_S = 40 * 60
GROW, HOLD, SHED, SHORT = (T0 + (10 * k + 8) * 60 for k in range(4))
FLEX = 'namespace="gpupool-flex"'
PROD = "gpupool-production"
GPU = 'resource="nvidia_com_gpu",unit="integer"'

Value = Callable[[int], float | None]
"""Value at t seconds after T0; None: no sample (the series does not exist then)."""
Series = dict[str, Value]
"""Series text (name + labels) -> its values."""

PHASES = ("grow", "hold", "shed", "short")
VLLM_A = 'instance="10.0.0.1:8000"'
GC_A = 'instance="10.0.0.1:9400"'
"""Scrape targets of pod a: vLLM, and its sidecar (another process, another start time)."""


def during(*phases: str, value: float = 1.0) -> Value:
    return lambda t: value if PHASES[min(t // 600, 3)] in phases else None


def by_phase(
    grow: float | None, hold: float | None, shed: float | None, short: float | None
) -> Value:
    return lambda t: (grow, hold, shed, short)[min(t // 600, 3)]


def one(t: int) -> float:
    return 1.0


def _flip_at(minute: int) -> Value:
    return lambda t: 1.0 if t >= minute * 60 else 0.0


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    gpus: int
    node: str | None
    phases: tuple[str, ...]
    priority_class: str
    terminating: bool = False
    unschedulable: bool = False


PODS = (
    Pod("prod", "api-0", 1, "n1", PHASES, PROD),
    Pod("prod", "api-1", 1, "n1", ("hold", "shed", "short"), PROD),
    Pod("prod", "api-2", 1, "n2", ("shed",), PROD),
    Pod("prod", "api-3", 2, None, ("short",), PROD, unschedulable=True),
    Pod("prod", "api-4", 0, None, PHASES, PROD, unschedulable=True),
    Pod("batch", "train-0", 1, None, PHASES, "gpupool-training", unschedulable=True),
    Pod("batch", "train-1", 1, "n3", PHASES, "gpupool-training"),
    Pod("gpupool-flex", "llm-6d4cf-x0001", 1, "n2", PHASES, "gpupool-idle-inference"),
    Pod("gpupool-flex", "llm-6d4cf-x0002", 1, "n3", ("grow",), "gpupool-idle-inference", True),
    Pod("gpupool-flex", "llm-6d4cf-x0003", 1, None, ("hold",), "gpupool-idle-inference"),
)


def _pods() -> dict[tuple[str, str], Series]:
    """kube-state-metrics' pod families for ``PODS`` (dense phases, as it exports them)."""
    phase: Series = {}
    info: Series = {}
    requests: Series = {}
    deleted: Series = {}
    unschedulable: Series = {}
    for pod in PODS:
        who = f'namespace="{pod.namespace}",pod="{pod.name}"'
        live = during(*pod.phases)
        for name in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            running = pod.node is not None and not pod.unschedulable
            holds = name == ("Running" if running else "Pending")
            phase[f'kube_pod_status_phase{{{who},phase="{name}"}}'] = during(
                *pod.phases, value=float(holds)
            )
        info[f'kube_pod_info{{{who},priority_class="{pod.priority_class}"}}'] = live
        if pod.gpus:
            node = f',node="{pod.node}"' if pod.node else ""
            requests[
                f'kube_pod_container_resource_requests{{{who},container="main"{node},{GPU}}}'
            ] = during(*pod.phases, value=pod.gpus)
        if pod.terminating:
            deleted[f"kube_pod_deletion_timestamp{{{who}}}"] = during(*pod.phases, value=T0)
        if pod.unschedulable:
            unschedulable[f"kube_pod_status_unschedulable{{{who}}}"] = live
    return {
        ("kube_pod_status_phase", "gauge"): phase,
        ("kube_pod_info", "gauge"): info,
        ("kube_pod_container_resource_requests", "gauge"): requests,
        ("kube_pod_deletion_timestamp", "gauge"): deleted,
        ("kube_pod_status_unschedulable", "gauge"): unschedulable,
    }


def _dcgm(node: str, gpu: int, pod: str | None = None, namespace: str = "prod") -> str:
    owner = f',namespace="{namespace}",pod="{pod}"' if pod else ""
    return f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",Hostname="{node}"{owner}}}'


def scenario() -> dict[tuple[str, str], Series]:
    """(family, type) -> series of the cluster in the module docstring."""
    util: Series = {
        _dcgm("n1", 0, "api-0"): by_phase(40, 100, 100, 50),
        _dcgm("n1", 1): by_phase(0, None, None, None),
        _dcgm("n1", 1, "api-1"): by_phase(None, 100, 100, 50),
        _dcgm("n2", 0, "llm-6d4cf-x0001", "gpupool-flex"): one,
        _dcgm("n2", 1): by_phase(0, 0, None, 0),
        _dcgm("n2", 1, "api-2"): by_phase(None, None, 90, None),
    }
    reasons: Series = {
        f'kube_pod_status_reason{{{FLEX},pod="llm-{m}",reason="Evicted"}}': _flip_at(m)
        for m in (1, 4, 5, 6)
    }
    reasons[f'kube_pod_status_reason{{{FLEX},pod="llm-9",reason="Evicted"}}'] = _flip_at(99)
    ns_llm = f'{FLEX},workload="llm"'
    nodes = {"n1": "gpu-prod", "n2": "gpu-flex", "n3": None, "n4": "gpu-flex"}
    return {
        ("DCGM_FI_DEV_GPU_UTIL", "gauge"): util,
        ("DCGM_FI_DEV_FB_USED", "gauge"): {
            'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="n1"}': lambda t: 30000
        },
        ("DCGM_FI_DEV_FB_FREE", "gauge"): {
            'DCGM_FI_DEV_FB_FREE{gpu="0",Hostname="n1"}': lambda t: 10000
        },
        ("kube_node_labels", "gauge"): {
            f'kube_node_labels{{node="{n}",label_gpupool_io_pool="{pool}"}}': one
            for n, pool in nodes.items()
            if pool
        },
        ("kube_node_status_allocatable", "gauge"): {
            f'kube_node_status_allocatable{{node="{n}",{GPU}}}': lambda t: 2 for n in nodes
        },
        ("kube_node_spec_unschedulable", "gauge"): {
            f'kube_node_spec_unschedulable{{node="{n}"}}': lambda t, n=n: float(n == "n4")
            for n in nodes
        },
        ("kube_node_status_condition", "gauge"): {
            f'kube_node_status_condition{{node="{n}",condition="Ready",status="true"}}': one
            for n in nodes
        },
        ("kube_deployment_spec_replicas", "gauge"): {
            f'kube_deployment_spec_replicas{{{FLEX},deployment="llm"}}': lambda t: 2,
        },
        ("kube_horizontalpodautoscaler_status_current_replicas", "gauge"): {
            f"kube_horizontalpodautoscaler_status_current_replicas{{{FLEX},"
            'horizontalpodautoscaler="llm"}': by_phase(1, 2, 2, 1),
        },
        ("kube_horizontalpodautoscaler_spec_max_replicas", "gauge"): {
            f"kube_horizontalpodautoscaler_spec_max_replicas{{{FLEX},"
            'horizontalpodautoscaler="llm"}': lambda t: 2,
        },
        ("kube_pod_status_reason", "gauge"): reasons,
        **_pods(),
        ("vllm:kv_cache_usage_perc", "gauge"): {
            f'vllm:kv_cache_usage_perc{{{ns_llm},pod="a",engine="0"}}': lambda t: 0.3,
            f'vllm:kv_cache_usage_perc{{{ns_llm},pod="a",engine="1"}}': lambda t: 0.6,
        },
        ("vllm:prefix_cache_queries", "counter"): {
            f'vllm:prefix_cache_queries_total{{{ns_llm},pod="a",engine="0",{VLLM_A}}}': lambda t: (
                20.0 * t
            ),
            f'vllm:prefix_cache_queries_total{{{ns_llm},pod="idle",engine="0"}}': lambda t: 0,
        },
        # a's vLLM started an hour before the data; the sidecar on the same pod (another
        # target) later, which must not count.
        ("process_start_time_seconds", "gauge"): {
            f'process_start_time_seconds{{{ns_llm},pod="a",{VLLM_A}}}': lambda t: T0 - 3600,
            f'process_start_time_seconds{{{ns_llm},pod="a",{GC_A}}}': lambda t: T0 + 100,
        },
        ("vllm:prompt_tokens", "counter"): {
            f'vllm:prompt_tokens_total{{{ns_llm},pod="a",engine="0"}}': lambda t: 10.0 * t,
            f'vllm:prompt_tokens_total{{{ns_llm},pod="idle",engine="0"}}': lambda t: 0,
        },
        ("vllm:prompt_tokens_by_source", "counter"): {
            f'vllm:prompt_tokens_by_source_total{{{ns_llm},pod="a",engine="0",source="{s}"}}': (
                lambda t, r=r: r * t
            )
            for s, r in (("external_kv_transfer", 4.0), ("local_cache_hit", 5.0))
        }
        | {
            f'vllm:prompt_tokens_by_source_total{{{ns_llm},pod="idle",engine="0",'
            'source="external_kv_transfer"}': lambda t: 0
        },
        # GCs a and b on llm's volume: capacity 0.5 + 0.25 files/s, b 0.05 abandoned writes/s.
        ("gpupool_kv_tier_deleted_files", "counter"): {
            f'gpupool_kv_tier_deleted_files_total{{{ns_llm},pod="{pod}",reason="{r}"}}': (
                lambda t, rate=rate: rate * t
            )
            for pod, r, rate in (
                ("a", "capacity", 0.5),
                ("a", "reclaimed", 0.0),
                ("a", "abandoned_write", 0.0),
                ("b", "capacity", 0.25),
                ("b", "reclaimed", 0.0),
                ("b", "abandoned_write", 0.05),
            )
        },
        ("gpupool_kv_tier_used_bytes", "gauge"): {
            f'gpupool_kv_tier_used_bytes{{{ns_llm},pod="a"}}': lambda t: 900,
            f'gpupool_kv_tier_used_bytes{{{ns_llm},pod="b"}}': by_phase(950, 950, 1100, 950),
        },
        ("gpupool_kv_tier_capacity_bytes", "gauge"): {
            f'gpupool_kv_tier_capacity_bytes{{{ns_llm},pod="{pod}"}}': lambda t: 1000
            for pod in ("a", "b")
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
            samples = ((t, value(t)) for t in range(0, END_S + 1, STEP_S))
            lines += [f"{name} {v} {T0 + t}" for t, v in samples if v is not None]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def backfilled(
    tmp_path_factory: pytest.TempPathFactory, test_policy: PoolPolicy
) -> Iterator[Server]:
    """The exporter series, and the budget's rules recorded over them as Prometheus would."""
    workdir = tmp_path_factory.mktemp("backfill")
    data = workdir / "data"
    backfill(openmetrics(), workdir, data)
    budget = recording.budget_groups(test_policy, c.build_catalogue(test_policy))
    backfill_rules(budget, T0, T0 + END_S, workdir / "rules", data, interval_s=2 * STEP_S)
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
    # n1 40 + 0, n2 1 + 0: dcgm's mean over every GPU it reports (flex included).
    assert values(backfilled, q(c.CLUSTER_GPU_UTILIZATION), GROW) == {"": 0.1025}
    assert values(backfilled, q(c.POOL_GPU_UTILIZATION), GROW) == {
        "pool=gpu-prod": 0.2,
        "pool=gpu-flex": 0.005,
    }
    per_gpu = values(backfilled, q(c.GPU_UTILIZATION), GROW)
    assert per_gpu["Hostname=n1,gpu=0,namespace=prod,node=n1,pod=api-0,pool=gpu-prod"] == 0.4
    assert len(per_gpu) == 4
    assert values(backfilled, q(c.GPU_MEMORY_USED), GROW) == {"Hostname=n1,gpu=0": 0.75}


STEPS = [
    # at, unallocated (prod, flex), spare, production utilization, headroom, budget
    (GROW, (1, 1), 2, 0.1, 1, 2),
    (HOLD, (0, 1), 1, 0.5, 0, 1),
    (SHED, (0, 0), 0, 0.725, 0, 0),
    (SHORT, (0, 1), -1, 0.25, 0, 0),
]
TERMS = [
    # at, the budget's step, production / flex pending GPUs, llm's grow GPUs
    (GROW, "grow", 0, 0, 1),  # min(1 placeable, spare 2, 1 kept)
    (HOLD, "hold", 0, 1, 0),  # x0003 waits: spare 1 - 1
    (SHED, "shed", 0, 0, 0),
    (SHORT, "shortfall", 2, 0, 0),  # api-3 waits for 2: spare -1, never below 0
]


@pytest.mark.slow
@pytest.mark.parametrize(("at", "free", "spare", "production", "headroom", "budget"), STEPS)
def test_every_step_of_the_budget(
    backfilled: Server,
    catalogue: c.Catalogue,
    at: int,
    free: tuple[int, int],
    spare: float,
    production: float,
    headroom: float,
    budget: float,
) -> None:
    """The standalone queries, and the recorded chain: the same numbers."""
    for q in (catalogue.query, recorded):
        assert values(backfilled, q(c.UNALLOCATED_GPUS), at) == {
            "pool=gpu-prod": free[0],
            "pool=gpu-flex": free[1],
        }
        assert values(backfilled, q(c.SPARE_GPUS), at) == {"": spare}
        assert values(backfilled, q(c.PRODUCTION_GPU_UTILIZATION), at) == {"": production}
        assert values(backfilled, q(c.FLEX_HEADROOM_GPUS), at) == {"pool=gpu-flex": headroom}
        assert values(backfilled, q(c.FLEX_GPU_BUDGET), at) == {"workload=llm": budget}


def recorded(record: str) -> str:
    """The series the budget's rules recorded (its name left out of the labels)."""
    return f"{record} + 0"


@pytest.mark.slow
@pytest.mark.parametrize(("at", "step", "prod_pending", "flex_pending", "grow"), TERMS)
def test_every_term_of_the_budget(
    backfilled: Server,
    catalogue: c.Catalogue,
    at: int,
    step: str,
    prod_pending: int,
    flex_pending: int,
    grow: int,
) -> None:
    """Each term the budget's rules record (n3 is in no pool, n4 is cordoned; x0002 is
    deleting, so llm holds x0001's GPU only), equal to its standalone query."""
    free = {"grow": (1, 1), "hold": (0, 1), "shed": (0, 0), "shortfall": (0, 1)}[step]
    llm = "workload=llm"
    expected = {
        c.NODE_UNALLOCATED_GPUS: {
            "node=n1,pool=gpu-prod": free[0],
            "node=n2,pool=gpu-flex": free[1],
        },
        c.SCHEDULABLE_GPUS: {"pool=gpu-prod": 2, "pool=gpu-flex": 2},
        c.RESERVED_GPUS: {"pool=gpu-prod": 0, "pool=gpu-flex": 0},
        c.PRODUCTION_PENDING_GPUS: {"": prod_pending},
        c.FLEX_PENDING_GPUS: {"": flex_pending},
        c.FLEX_HELD_GPUS: {llm: 1},
        c.FLEX_HPA_STEP_GPUS: {llm: 1},  # floor(2 replicas x 0.1) + 1
        c.FLEX_BUDGET_STEP: {f"step={step}": 1},
        c.FLEX_SHED_GPUS: {llm: 1},  # a shortfall of 1 or none: one HPA step
        c.FLEX_GROW_GPUS: {llm: grow},
    }
    for record, want in expected.items():
        assert values(backfilled, recorded(record), at) == want, record
        assert values(backfilled, catalogue.query(record), at) == want, record


PRODUCTION_TRACE = [
    # at, GPUs production demands (bound + pending requests), its busy GPU-equivalents
    (GROW, 1, 0.4),
    (HOLD, 2, 2.0),
    (SHED, 3, 2.9),
    (SHORT, 4, 1.0),  # api-0 and api-1 bound at 50 %; api-3 waits for 2 GPUs
]


@pytest.mark.slow
@pytest.mark.parametrize(("at", "demanded", "busy"), PRODUCTION_TRACE)
def test_what_production_demands_and_keeps_busy(
    backfilled: Server, catalogue: c.Catalogue, at: int, demanded: int, busy: float
) -> None:
    """The two series a production trace is made of; api-4 requests no GPU and the
    training pods are not production, so neither counts."""
    q = catalogue.query
    assert values(backfilled, q(c.PRODUCTION_GPUS_DEMANDED), at) == {"": demanded}
    assert values(backfilled, q(c.PRODUCTION_BUSY_GPUS), at) == {"": pytest.approx(busy)}


def _variant(policy: PoolPolicy, **changes: object) -> c.Catalogue:
    document = policy.model_dump(by_alias=True, mode="json")
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = document
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return c.build_catalogue(parse_policy(document))


@pytest.mark.slow
def test_the_reserve_of_every_pool_is_kept_unallocated(
    backfilled: Server, test_policy: PoolPolicy
) -> None:
    """Reserves of 0.5 keep floor(2 x 0.5) GPUs of each pool back: at "grow" the spare drops
    from 2 to 0, so flex no longer grows (budget = held), and at "hold" it is short."""
    reserved = _variant(
        test_policy, node_pools__0__reserve_ratio=0.5, node_pools__1__reserve_ratio=0.5
    )
    assert values(backfilled, reserved.query(c.SPARE_GPUS), GROW) == {"": 0}
    assert values(backfilled, reserved.query(c.FLEX_HEADROOM_GPUS), GROW) == {"pool=gpu-flex": 0}
    assert values(backfilled, reserved.query(c.FLEX_GPU_BUDGET), GROW) == {"workload=llm": 1}
    assert values(backfilled, reserved.query(c.FLEX_GPU_BUDGET), HOLD) == {"workload=llm": 0}


@pytest.mark.slow
def test_a_flex_pools_reserve_stays_free_in_that_pool(
    backfilled: Server, test_policy: PoolPolicy
) -> None:
    """gpu-flex reserving 0.5 keeps 1 of its 2 GPUs free although gpu-prod's free GPU would
    cover the sum of reserves: at "grow" the spare is 1 but flex may not grow (budget 1)."""
    reserved = _variant(test_policy, node_pools__1__reserve_ratio=0.5)
    assert values(backfilled, reserved.query(c.SPARE_GPUS), GROW) == {"": 1}
    assert values(backfilled, reserved.query(c.FLEX_HEADROOM_GPUS), GROW) == {"pool=gpu-flex": 0}
    assert values(backfilled, reserved.query(c.FLEX_GPU_BUDGET), GROW) == {"workload=llm": 1}


@pytest.mark.slow
def test_unattributed_production_gpus_never_grow_flex(
    backfilled: Server, test_policy: PoolPolicy
) -> None:
    """Call the training class "production": train-1 holds a GPU no dcgm series names, so
    production's utilization is absent and the budget only holds (1, not 2) at "grow"."""
    blind = _variant(
        test_policy,
        priorities__production__name="gpupool-training",
        priorities__training__name="gpupool-batch",
    )
    assert values(backfilled, blind.query(c.PRODUCTION_GPU_UTILIZATION), GROW) == {}
    assert values(backfilled, blind.query(c.FLEX_GPU_BUDGET), GROW) == {"workload=llm": 1}


@pytest.mark.slow
def test_budget_is_absent_without_data(backfilled: Server, catalogue: c.Catalogue) -> None:
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


DELETIONS = {"capacity": 45.0, "abandoned_write": 3.0, "reclaimed": 0.0}
"""Files per minute on llm's volume: (0.5 + 0.25) x 60 capacity, 0.05 x 60 abandoned."""


@pytest.mark.slow
def test_warmup_and_snapshot_tier_queries(backfilled: Server, catalogue: c.Catalogue) -> None:
    q, pod_a = catalogue.query, "namespace=gpupool-flex,pod=a,workload=llm"
    # vLLM's own start, not the sidecar's (T0 + 100); idle exports none.
    assert values(backfilled, q(c.VLLM_START_TIME), GROW) == {pod_a: T0 - 3600}
    share = values(backfilled, q(c.PROMPT_TOKENS_FROM_TIER), GROW)
    assert share.keys() == {pod_a}, "no prompt tokens, no share"
    assert share[pod_a] == pytest.approx(0.4, rel=1e-12)
    llm = "namespace=gpupool-flex,workload=llm"
    assert values(backfilled, q(c.KV_TIER_DELETIONS), GROW) == pytest.approx(
        {f"namespace=gpupool-flex,reason={r},workload=llm": v for r, v in DELETIONS.items()},
        rel=1e-12,
    )
    assert values(backfilled, q(c.KV_TIER_FILL), GROW) == {llm: 0.95}
    assert values(backfilled, q(c.KV_TIER_FILL), SHED) == {llm: 1.1}


@pytest.mark.slow
def test_kube_state_queries(backfilled: Server, catalogue: c.Catalogue) -> None:
    q = catalogue.query
    reasons = ("eviction-api", "kubelet", "node", "preemption")
    # Window (3m, 8m]: pods flipping at 4, 5 and 6 minutes (Evicted: kubelet); llm-1 before.
    assert values(backfilled, q(c.FLEX_EVICTIONS), GROW) == {
        f"namespace=gpupool-flex,reason={r}": 0.6 if r == "kubelet" else 0 for r in reasons
    }
    assert values(backfilled, q(c.FLEX_EVICTIONS), HOLD) == {
        f"namespace=gpupool-flex,reason={r}": 0 for r in reasons
    }
    # Only api-3 is production, wants GPUs and cannot be placed (api-4 wants none, train-0
    # is training).
    assert values(backfilled, q(c.PROD_PODS_PENDING), GROW) == {"": 0}
    assert values(backfilled, q(c.PROD_PODS_PENDING), SHORT) == {"": 1}
    assert values(backfilled, q(c.FLEX_PODS_RUNNING), GROW) == {"": 2}
    assert values(backfilled, q(c.FLEX_HPA_AT_MAX), GROW) == {
        "horizontalpodautoscaler=llm,namespace=gpupool-flex,workload=llm": 0
    }
    assert values(backfilled, q(c.FLEX_HPA_AT_MAX), HOLD) == {
        "horizontalpodautoscaler=llm,namespace=gpupool-flex,workload=llm": 1
    }


def test_every_catalogue_query_is_checked_here(catalogue: c.Catalogue) -> None:
    source = Path(__file__).read_text()
    for record in catalogue:
        constant = next(k for k, v in vars(c).items() if v == record.record and k.isupper())
        assert f"c.{constant}" in source, f"{record.record} has no backfill check"
