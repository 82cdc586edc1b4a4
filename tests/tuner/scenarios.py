"""The tuner's scenarios as the raw exporter series a cluster would publish, written as
OpenMetrics and backfilled with ``promtool tsdb create-blocks-from openmetrics``; the
shipped policy's recording rules (the metrics catalogue) are then evaluated over them with
``promtool tsdb create-blocks-from rules`` (``build_prometheus``), so the tuner reads the
``gpupool:*`` series its real rules would have recorded, through its real query path.

Sources: kube-state-metrics (nodes with their pool label, pods with phase, PriorityClass,
GPU requests and disruption reasons in the sparse v2.20 shape, the flex Deployment and its
HPA), dcgm-exporter (per-GPU utilization with the pod holding the GPU) and vLLM (KV usage,
prefix-cache counters, waiting requests per instance).

The cluster: gpu-prod = nodes p1, p2 and gpu-flex = nodes f1, f2 (8 GPUs each, 32 in all);
production pods of 4 GPUs fill p1, p2, then f2 (production takes GPUs back from flex);
``replicas`` flex pods of 1 GPU on the rest of f1/f2 under an HPA whose maxReplicas is the
policy's (8). Each scenario occupies its own stretch of time (gaps
longer than the tuner's window plus every lookback), so one Prometheus holds them all and a
cycle evaluated at a scenario's end sees only it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from alerts.bundle import all_groups
from policy import DEFAULT_POLICY, parse_policy
from runtime.metrics import catalogue
from runtime.tuner import signals
from tests.harness.servers import Server, backfill, backfill_rules, start_prometheus

T0 = 1_767_225_600
"""2026-01-01T00:00:00Z: the first scenario starts here."""
STEP_S = 30
"""Scrape interval of the synthetic exporters and evaluation interval of the rules."""
SPAN_S = 40 * 60
"""Each scenario's history: the tuner's 30m window plus 10 m for the eviction rule's
``[5m] offset 5m`` and the hit rate's ``rate()`` to settle."""
SLOT_S = SPAN_S + 15 * 60
"""Start-to-start distance of scenarios: 15 minutes of silence between them, more than
every lookback (5 m) and rate window (5 m) the recorded series use, so a scenario's
window (its last 30 of 40 minutes) holds no sample computed from the one before."""
SAMPLES = SPAN_S // STEP_S + 1
BLIP_AT = SAMPLES - 30
"""Index of a single-sample blip: inside the tuner's window, away from both ends."""

POLICY_TEXT = DEFAULT_POLICY.read_text().replace("max_replicas: auto", "max_replicas: 8", 1)
"""The shipped policy with an explicit flex bound (8), the one the tuner's scenarios run on:
the widening lever steps explicit bounds (``auto`` is at what the pools hold already)."""
POLICY = parse_policy(yaml.safe_load(POLICY_TEXT))
FLEX_NS = POLICY.cluster.flex_namespace
WORKLOAD = POLICY.workloads[0]
PROD_NS = "inference"
POOL_LABEL = catalogue.ksm_label(POLICY.cluster.pool_label)
GPU_RESOURCE = POLICY.metrics.gpu_resource
NODES = {"p1": "gpu-prod", "p2": "gpu-prod", "f1": "gpu-flex", "f2": "gpu-flex"}
GPUS_PER_NODE = 8

Values = float | list[float]
"""A constant, or one value per sample of the span."""


def once(value: float, rest: float) -> list[float]:
    """``rest`` in every sample but one (``BLIP_AT``), which is ``value``."""
    return [value if i == BLIP_AT else rest for i in range(SAMPLES)]


def at(values: Values, i: int) -> float:
    return values[i] if isinstance(values, list) else values


@dataclass(frozen=True)
class Instance:
    """One flex vLLM instance (its pod is one of the flex replicas)."""

    pod: int
    hit_rate: float = 0.92
    usage: float = 0.60
    queries_per_s: float = 20.0


@dataclass(frozen=True)
class Scenario:
    name: str
    production_utilization: Values = 0.4
    """The catalogue's production utilization: the duty cycle of production's GPUs summed,
    over every schedulable GPU (32); each production GPU runs at ``u x 32 / gpus``."""
    production_gpus: int = 16
    """GPUs the running production pods hold (4 per pod)."""
    production_pending: Values = 0
    """Production pods (4 GPUs each) the scheduler has not placed."""
    disrupted: Mapping[str, Values] = field(default_factory=dict)
    """Raw KSM reason -> flex pods newly disrupted per scrape (each row lives two scrapes,
    the grace period of a deleted pod). ``EvictionByEvictionAPI`` is reported by
    ``kube_pod_status_disruption_reason``, the others by ``kube_pod_status_reason``."""
    replicas: Values = 4
    """Running flex replicas: the HPA's current replicas (maxReplicas is the policy's)."""
    queue: Values = 0
    """Requests waiting on the first instance."""
    instances: tuple[Instance, ...] = (Instance(0),)
    ends_before_s: int = 0
    """The exporters stop this long before the evaluation time (stale metrics)."""


PREEMPTING: Mapping[str, Values] = {"PreemptionByScheduler": 4.0}
"""4 flex pods preempted per 30 s scrape: 8 per minute, above the policy's 5. ``storm`` has
production pods pending throughout; ``storm_near_shed`` none, with production's utilization
(0.64) in the band just below the shipped shed threshold (0.65 - margin 0.02 = 0.63);
``storm_blip`` reaches that band in one sample only."""


def idle(
    name: str, *, replicas: float = 8.0, queue: float = 30.0, ends_before_s: int = 0
) -> Scenario:
    """Idle production, queued flex requests, the HPA at maxReplicas (8) unless told."""
    return Scenario(
        name,
        production_utilization=0.2,
        production_gpus=8,
        queue=queue,
        replicas=replicas,
        ends_before_s=ends_before_s,
    )


SCENARIOS = [
    Scenario("quiet"),
    Scenario("storm", production_pending=1, disrupted=PREEMPTING),
    Scenario(
        "storm_near_shed",
        production_utilization=0.64,
        production_gpus=24,
        disrupted=PREEMPTING,
    ),
    Scenario(
        "storm_blip",
        production_utilization=once(0.64, 0.5),
        production_gpus=24,
        disrupted=PREEMPTING,
    ),
    Scenario("drain", production_pending=1, disrupted={"EvictionByEvictionAPI": 4.0}),
    idle("idle"),
    idle("idle_below_max", replicas=5.0),
    Scenario(
        "blips",
        production_utilization=once(0.7, 0.4),
        production_gpus=32 - 8,
        production_pending=once(1, 0),
        disrupted={"PreemptionByScheduler": once(40, 0)},
        replicas=once(8, 4),
        queue=once(30, 0),
    ),
    Scenario("kv_full", instances=(Instance(0, 0.60, 0.92), Instance(1, 0.95, 0.60))),
    Scenario("kv_split", instances=(Instance(0, 0.60, 0.60), Instance(1, 0.95, 0.92))),
    Scenario("kv_sparse", instances=(Instance(0, 0.60, 0.30),)),
    idle("stale", ends_before_s=600),
    idle("nan", queue=math.nan),
]


def evaluation_time(name: str) -> float:
    """When a cycle should look at scenario ``name``: the end of its span."""
    index = next(i for i, s in enumerate(SCENARIOS) if s.name == name)
    return float(T0 + index * SLOT_S + SPAN_S)


def flex_pod(i: int) -> str:
    """Pod names as the Deployment's ReplicaSet makes them (the budget's held-GPU regex)."""
    return f"{WORKLOAD.name}-7c9f5-r{i}"


Sample = tuple[str, str, float]
"""(family, labels, value) at one instant."""


def _pod(namespace: str, pod: str, phase: str, klass: str, gpus: int, node: str) -> list[Sample]:
    who = f'namespace="{namespace}",pod="{pod}"'
    return [
        *(
            ("kube_pod_status_phase", f'{who},phase="{p}"', float(p == phase))
            for p in ("Pending", "Running")
        ),
        ("kube_pod_info", f'{who},priority_class="{klass}"', 1.0),
        # PodScheduled=False/Unschedulable; 0 rather than absent once placed: backfilled
        # data has no staleness markers, so a vanished row would read 1 for 5 more minutes
        ("kube_pod_status_unschedulable", who, float(phase == "Pending" and not node)),
        (
            "kube_pod_container_resource_requests",
            f'{who},container="main",node="{node}",resource="{GPU_RESOURCE}",unit="integer"',
            float(gpus),
        ),
    ]


def _gpu(node: str, gpu: int, percent: float, namespace: str = "", pod: str = "") -> Sample:
    ns_label, pod_label = POLICY.metrics.gpu_pod_labels
    held = f',{ns_label}="{namespace}",{pod_label}="{pod}"' if pod else ""
    labels = f'gpu="{gpu}",{POLICY.metrics.gpu_node_label}="{node}"{held}'
    return ("DCGM_FI_DEV_GPU_UTIL", labels, percent)


def _state(s: Scenario, i: int, t: int, start: int) -> Iterator[Sample]:
    """Every raw series of scenario ``s`` at its ``i``-th scrape, time ``t``."""
    prod_class, flex_class = (
        POLICY.priorities.production.name,
        POLICY.priorities.idle_inference.name,
    )
    for node, pool in NODES.items():
        yield ("kube_node_labels", f'node="{node}",{POOL_LABEL}="{pool}"', 1.0)
        yield (
            "kube_node_status_allocatable",
            f'node="{node}",resource="{GPU_RESOURCE}",unit="integer"',
            float(GPUS_PER_NODE),
        )
        yield ("kube_node_spec_unschedulable", f'node="{node}"', 0.0)
        yield ("kube_node_status_condition", f'node="{node}",condition="Ready",status="true"', 1.0)
    used: dict[str, int] = dict.fromkeys(NODES, 0)
    duty = at(s.production_utilization, i) * len(NODES) * GPUS_PER_NODE / s.production_gpus
    assert duty <= 1, f"{s.name}: production cannot be that busy on {s.production_gpus} GPUs"
    for k in range(s.production_gpus // 4):
        node = ("p1", "p2", "f2", "f1")[k // 2]
        pod = f"llama-70b-prod-0{k}"
        yield from _pod(PROD_NS, pod, "Running", prod_class, 4, node)
        for _ in range(4):
            yield _gpu(node, used[node], 100 * duty, PROD_NS, pod)
            used[node] += 1
    for k in range(2):  # pending production pods (a row while pending)
        phase = "Pending" if k < at(s.production_pending, i) else "Succeeded"
        yield from _pod(PROD_NS, f"llama-70b-prod-p{k}", phase, prod_class, 4, "")
    replicas = int(at(s.replicas, i))
    for r in range(replicas):
        node = next(n for n in ("f1", "f2") if used[n] < GPUS_PER_NODE)
        yield from _pod(FLEX_NS, flex_pod(r), "Running", flex_class, 1, node)
        yield _gpu(node, used[node], 90.0, FLEX_NS, flex_pod(r))
        used[node] += 1
    for node in NODES:
        for gpu in range(used[node], GPUS_PER_NODE):
            yield _gpu(node, gpu, 0.0)
    flex = f'namespace="{FLEX_NS}"'
    yield ("kube_deployment_spec_replicas", f'{flex},deployment="{WORKLOAD.name}"', float(replicas))
    hpa = f'{flex},horizontalpodautoscaler="{WORKLOAD.name}"'
    yield ("kube_horizontalpodautoscaler_status_current_replicas", hpa, float(replicas))
    yield ("kube_horizontalpodautoscaler_spec_max_replicas", hpa, float(WORKLOAD.max_replicas))
    for reason, per_scrape in s.disrupted.items():
        family = (
            "kube_pod_status_disruption_reason"
            if reason == "EvictionByEvictionAPI"
            else "kube_pod_status_reason"
        )
        for born in (i - 1, i):  # a disrupted pod's row lives two scrapes
            if born < 0:
                continue
            for n in range(int(at(per_scrape, born))):
                pod = f"{WORKLOAD.name}-7c9f5-{s.name.replace('_', '')}{born}x{n}"
                yield (family, f'{flex},pod="{pod}",uid="u-{pod}",reason="{reason}"', 1.0)
    elapsed = t - start
    for n, inst in enumerate(s.instances):
        who = f'{flex},{POLICY.metrics.workload_label}="{WORKLOAD.name}",pod="{flex_pod(inst.pod)}"'
        yield ("vllm:kv_cache_usage_perc", f'{who},engine="0"', inst.usage)
        queries = inst.queries_per_s * elapsed
        yield ("vllm:prefix_cache_queries_total", f'{who},engine="0"', queries)
        yield ("vllm:prefix_cache_hits_total", f'{who},engine="0"', inst.hit_rate * queries)
        yield ("vllm:num_requests_waiting", f'{who},engine="0"', at(s.queue, i) if n == 0 else 0.0)


FAMILIES: dict[str, str] = {
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
}
"""OpenMetrics family type of the counters (the rest are gauges)."""


def _family(name: str) -> str:
    return name.removesuffix("_total") if FAMILIES.get(name) == "counter" else name


def openmetrics() -> str:
    """All scenarios as one OpenMetrics text: families contiguous, each series in time order."""
    series: dict[str, dict[str, list[str]]] = {}
    for index, scenario in enumerate(SCENARIOS):
        start = T0 + index * SLOT_S
        last = start + SPAN_S - scenario.ends_before_s
        for i, t in enumerate(range(start, last + 1, STEP_S)):
            for name, labels, value in _state(scenario, i, t, start):
                text = "NaN" if math.isnan(value) else repr(float(value))
                series.setdefault(name, {}).setdefault(labels, []).append(f"{text} {t}")
    lines = []
    for name in sorted(series, key=_family):
        lines.append(f"# TYPE {_family(name)} {FAMILIES.get(name, 'gauge')}")
        for labels, samples in sorted(series[name].items()):
            lines += [f"{name}{{{labels}}} {sample}" for sample in samples]
    return "\n".join([*lines, "# EOF"]) + "\n"


PROMETHEUS_CONFIG = "global:\n  scrape_interval: 30s\n"
"""No scrape targets: the backfilled blocks are all the data."""


def build_prometheus(workdir: Path) -> Server:
    """Raw series backfilled, the shipped policy's recording rules of the series the tuner
    reads (and the budget's terms they read) evaluated over them as the PrometheusRule
    carries them (promtool, a pass per level), and Prometheus started on all of it."""
    data = workdir / "data"
    backfill(openmetrics(), workdir, data)
    rules = all_groups(POLICY)
    end = T0 + (len(SCENARIOS) - 1) * SLOT_S + SPAN_S
    # exporters sampled every STEP_S: a 5 m lookback, as in a running Prometheus
    backfill_rules(
        rules,
        T0,
        end,
        workdir / "rules",
        data,
        interval_s=STEP_S,
        lookback_s=300,
        only=set(signals.SIGNALS),
    )
    return start_prometheus(PROMETHEUS_CONFIG, workdir / "prom", data_dir=data)
