"""The one catalogue of named PromQL queries, built from the policy.

Every entry becomes a ``gpupool:...`` recording rule; alerts, the flex HPA (through
prometheus-adapter), the tuner and the dashboard read the recorded series, so a threshold or
label name changes in one place: the policy. Each ``expr`` is standalone (it reads only raw
exporter series, never another recorded series), so the tuner can also run it on backfilled
data that no rule ever evaluated: ``build_catalogue(policy).query(KV_CACHE_HIT_RATE)``.

Sources (names in ../shared/FACTS.md): dcgm-exporter (GPU utilization and framebuffer),
kube-state-metrics (node labels, pod phases and status reasons, deployment replicas) and
vLLM's own ``/metrics``. Flex evictions come from kube-state-metrics'
``kube_pod_status_reason`` (docs/alerts.md says why, and what it misses).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from policy.base import duration_seconds
from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload

CLUSTER_GPU_UTILIZATION = "gpupool:cluster_gpu_utilization:ratio"
GPU_UTILIZATION = "gpupool:gpu_utilization:ratio"
POOL_GPU_UTILIZATION = "gpupool:pool_gpu_utilization:ratio"
GPU_MEMORY_USED = "gpupool:gpu_memory_used:ratio"
FLEX_HEADROOM_GPUS = "gpupool:flex_headroom_gpus"
FLEX_GPU_BUDGET = "gpupool:flex_gpu_budget"
KV_CACHE_USAGE = "gpupool:kv_cache_usage:ratio"
KV_CACHE_HIT_RATE = "gpupool:kv_cache_hit_rate:ratio"
VLLM_PREEMPTIONS = "gpupool:vllm_preemptions:rate5m"
VLLM_QUEUE_DEPTH = "gpupool:vllm_queue_depth"
FLEX_EVICTIONS = "gpupool:flex_evictions:per_minute"
PROD_PODS_PENDING = "gpupool:prod_pods_pending"
FLEX_PODS_RUNNING = "gpupool:flex_pods_running"

BUDGET_LABEL = "workload"
"""Label of ``gpupool:flex_gpu_budget`` naming the workload; the HPA selects on it."""
HPA_METRIC = "gpupool_flex_gpu_budget"
"""External-metric name prometheus-adapter serves ``gpupool:flex_gpu_budget`` under."""


@dataclass(frozen=True)
class Query:
    """One named query: the series it is recorded as, its PromQL, and what it means."""

    record: str
    expr: str
    help: str
    unit: str

    def recording_rule(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Source:
    """An exporter the catalogue depends on, and a series whose absence means it is gone."""

    name: str
    selector: str


@dataclass(frozen=True)
class Catalogue:
    """The queries of one policy, in a stable order, looked up by recorded-series name."""

    queries: tuple[Query, ...]
    sources: tuple[Source, ...]

    def __getitem__(self, record: str) -> Query:
        for query in self.queries:
            if query.record == record:
                return query
        raise KeyError(f"no query records {record!r}; known: {[q.record for q in self.queries]}")

    def __iter__(self) -> Iterator[Query]:
        return iter(self.queries)

    def query(self, record: str) -> str:
        """The standalone PromQL of ``record`` (works on raw data without the recording rules)."""
        return self[record].expr


def ksm_label(kubernetes_label: str) -> str:
    """KSM name of a label (``gpupool.io/pool`` -> ``label_gpupool_io_pool``)."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", kubernetes_label)


def num(value: float) -> str:
    """A PromQL number literal that round-trips the policy's float."""
    return repr(float(value))


def build_catalogue(policy: PoolPolicy) -> Catalogue:
    """All of gpupool's named queries for ``policy``."""
    return _Builder(policy).catalogue()


class _Builder:
    """Composes the PromQL strings; one method per fragment several queries share."""

    def __init__(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.m = policy.metrics
        self.flex_ns = policy.cluster.flex_namespace
        self.window = self.m.rate_window
        self.by_instance = ", ".join(self.m.instance_labels)

    def vllm(self, name: str) -> str:
        """Selector of a vLLM metric (``name`` without prefix) of the flex instances."""
        return f'vllm:{name}{{namespace="{self.flex_ns}"}}'

    def gpu_util_by_pool(self, pools: list[NodePool]) -> str:
        """Per-GPU utilization (0-1) with a ``pool`` label, joined through the node's pool label."""
        ksm = ksm_label(self.policy.cluster.pool_label)
        names = "|".join(p.name for p in pools)
        node_pool = (
            f'max by (node, pool) (label_replace(kube_node_labels{{{ksm}=~"{names}"}}, '
            f'"pool", "$1", "{ksm}", "(.*)"))'
        )
        gpu = (
            f'label_replace(DCGM_FI_DEV_GPU_UTIL, "node", "$1", "{self.m.gpu_node_label}", "(.*)")'
        )
        return f"(({gpu}) / 100 * on (node) group_left (pool) {node_pool})"

    def cluster_utilization(self) -> str:
        return "(avg(DCGM_FI_DEV_GPU_UTIL) / 100)"

    def headroom(self, pool: NodePool) -> str:
        """Idle GPUs of one flex pool minus its reserve, never below zero."""
        gpus = self.gpu_util_by_pool([pool])
        idle = f"sum by (pool) ({gpus} < bool {num(self.policy.elastic.idle_gpu_below)})"
        if pool.reserve_ratio > 0:
            idle = f"({idle} - floor(count by (pool) ({gpus}) * {num(pool.reserve_ratio)}))"
        return f"clamp_min({idle}, 0)"

    def budget(self, workload: FlexWorkload) -> str:
        """GPUs ``workload`` may occupy: grow into its share of headroom, shed a replica, or hold.

        Missing data yields no series (the HPA then holds), never more flex load.
        """
        elastic, g = self.policy.elastic, workload.gpus_per_replica
        pool = self.policy.pool_of(workload)
        sharing = sum(1 for w in self.policy.workloads if w.pool == workload.pool)
        cluster = self.cluster_utilization()
        held = (
            f'sum(kube_deployment_spec_replicas{{namespace="{self.flex_ns}", '
            f'deployment="{workload.name}"}}) * {g}'
        )
        step = (
            f"(floor(sum({self.headroom(pool)}) / {sharing * g}) * {g}"
            f" and on () ({cluster} < {num(elastic.scale_up_below)}))"
            f" or (vector(-{g}) and on () ({cluster} > {num(elastic.shed_above)}))"
            f" or (0 * {cluster})"
        )
        return (
            f'label_replace(clamp_min({held} + ({step}), 0), "{BUDGET_LABEL}", '
            f'"{workload.name}", "", "")'
        )

    def evictions(self) -> str:
        """Flex pods whose eviction/preemption reason turned on within the window, per minute."""
        reasons = "|".join(self.m.eviction_reasons)
        sel = f'kube_pod_status_reason{{namespace="{self.flex_ns}", reason=~"{reasons}"}}'
        turned_on = f"max_over_time({sel}[{self.window}]) - min_over_time({sel}[{self.window}])"
        minutes = num(duration_seconds(self.window) / 60)
        zero = f'0 * sum by (namespace) (kube_pod_status_phase{{namespace="{self.flex_ns}"}})'
        return f"(sum by (namespace) ({turned_on}) / {minutes}) or ({zero})"

    def catalogue(self) -> Catalogue:
        p, w, by = self.policy, self.window, self.by_instance
        all_pools = self.gpu_util_by_pool(p.node_pools)
        prod_class = p.priorities.production.name
        queries = [
            Query(
                CLUSTER_GPU_UTILIZATION,
                self.cluster_utilization(),
                "Mean utilization of every GPU dcgm-exporter reports; drives grow/shed.",
                "ratio",
            ),
            Query(GPU_UTILIZATION, all_pools, "Utilization of each GPU, with its pool.", "ratio"),
            Query(
                POOL_GPU_UTILIZATION,
                f"avg by (pool) ({all_pools})",
                "Mean GPU utilization of each node pool.",
                "ratio",
            ),
            Query(
                GPU_MEMORY_USED,
                "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
                "Framebuffer share in use on each GPU.",
                "ratio",
            ),
            Query(
                FLEX_HEADROOM_GPUS,
                " or ".join(self.headroom(pool) for pool in p.flex_pools),
                "Idle GPUs (below elastic.idle_gpu_below) of each flex pool, less its reserve.",
                "gpus",
            ),
            *(
                [
                    Query(
                        FLEX_GPU_BUDGET,
                        " or ".join(self.budget(workload) for workload in p.workloads),
                        "GPUs each flex workload may occupy; its HPA divides by gpus_per_replica.",
                        "gpus",
                    )
                ]
                if p.workloads
                else []
            ),
            Query(
                KV_CACHE_USAGE,
                f"max by ({by}) ({self.vllm('kv_cache_usage_perc')})",
                "Share of KV-cache blocks in use on each flex vLLM instance.",
                "ratio",
            ),
            Query(
                KV_CACHE_HIT_RATE,
                f"sum by ({by}) (rate({self.vllm('prefix_cache_hits_total')}[{w}]))"
                f" / (sum by ({by}) (rate({self.vllm('prefix_cache_queries_total')}[{w}]))"
                " > 0)",
                "Prefix-cache hits per queried token; absent where an instance had no queries.",
                "ratio",
            ),
            Query(
                VLLM_PREEMPTIONS,
                f"sum by ({by}) (rate({self.vllm('num_preemptions_total')}[{w}]))",
                "vLLM request preemptions per second (KV cache ran out) per instance.",
                "per_second",
            ),
            Query(
                VLLM_QUEUE_DEPTH,
                f"sum by (namespace, {self.m.workload_label}) "
                f"({self.vllm('num_requests_waiting')})",
                "Requests waiting for a slot, per flex workload.",
                "requests",
            ),
            Query(
                FLEX_EVICTIONS,
                self.evictions(),
                "Flex pods evicted or preempted per minute (kube_pod_status_reason).",
                "per_minute",
            ),
            Query(
                PROD_PODS_PENDING,
                f'sum(kube_pod_status_phase{{phase="Pending"}} * on (namespace, pod) group_left () '
                f'max by (namespace, pod) (kube_pod_info{{priority_class="{prod_class}"}}))',
                "Pending pods of the production PriorityClass.",
                "pods",
            ),
            Query(
                FLEX_PODS_RUNNING,
                f'sum(kube_pod_status_phase{{namespace="{self.flex_ns}", phase="Running"}})',
                "Running pods in the flex namespace.",
                "pods",
            ),
        ]
        sources = [
            Source("dcgm-exporter", "DCGM_FI_DEV_GPU_UTIL"),
            Source("kube-state-metrics", "kube_pod_status_phase"),
        ]
        if p.workloads:
            sources.append(Source("vllm", self.vllm("kv_cache_usage_perc")))
        return Catalogue(tuple(queries), tuple(sources))
