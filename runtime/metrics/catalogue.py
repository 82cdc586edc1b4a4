"""The one catalogue of named PromQL queries, built from the policy.

Every entry becomes a ``gpupool:...`` recording rule; alerts, the flex HPA (through
prometheus-adapter), the tuner and the dashboard read the recorded series, so a threshold or
label name changes in one place: the policy. The flex budget is a chain of such rules, one
per term (``TERMS``, in evaluation order), each reading the terms before it, so a policy
change rewrites the one term that reads it; every other ``expr`` reads raw exporter series
only. ``query()`` is standalone either way (the chain's recorded series inlined), so the
tuner can run it on backfilled data that no rule ever evaluated:
``build_catalogue(policy).query(KV_CACHE_HIT_RATE)``.

The other queries sit in one section per concern (``_Builder.gpu_queries`` and the methods
after it, docs/design/catalogue.md), each naming the policy fields it reads (``knobs``).

Sources of the series names: dcgm-exporter (NVIDIA/dcgm-exporter, its default counters in
``default-counters.csv``: GPU utilization with the pod holding each GPU, framebuffer),
kube-state-metrics (kubernetes/kube-state-metrics: node labels and allocatable GPUs, pod
phases, GPU requests, priority classes, deletion marks and disruption reasons, deployment
replicas), vLLM's own ``/metrics`` (vllm-project/vllm 0.32) and, with
``kv_cache.kv_preservation: filesystem``, the snapshot GC sidecar of each flex pod
(``gpupool_kv_tier_*``, runtime/kvcache/preservation/gc.py; absent otherwise, so its queries
record nothing there). The flex budget (``_Builder.chain``) is
mirrored in Python by ``runtime.sim.budget`` for the what-if engine; change both together.
Flex evictions come from ``runtime.metrics.evictions`` (``kube_pod_status_reason`` and, on
kube-state-metrics >= 2.20, ``kube_pod_status_disruption_reason``; docs/alerts.md says what
each version sees).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.metrics.evictions import flex_evictions_expr

CLUSTER_GPU_UTILIZATION = "gpupool:cluster_gpu_utilization:ratio"
GPU_UTILIZATION = "gpupool:gpu_utilization:ratio"
POOL_GPU_UTILIZATION = "gpupool:pool_gpu_utilization:ratio"
GPU_MEMORY_USED = "gpupool:gpu_memory_used:ratio"
FLEX_HEADROOM_GPUS = "gpupool:flex_headroom_gpus"
PRODUCTION_GPU_UTILIZATION = "gpupool:production_gpu_utilization:ratio"
PRODUCTION_GPUS_DEMANDED = "gpupool:production_gpus_demanded"
PRODUCTION_BUSY_GPUS = "gpupool:production_busy_gpus"
UNALLOCATED_GPUS = "gpupool:unallocated_gpus"
SPARE_GPUS = "gpupool:spare_gpus"
FLEX_GPU_BUDGET = "gpupool:flex_gpu_budget"
KV_CACHE_USAGE = "gpupool:kv_cache_usage:ratio"
KV_CACHE_HIT_RATE = "gpupool:kv_cache_hit_rate:ratio"
VLLM_PREEMPTIONS = "gpupool:vllm_preemptions:rate5m"
VLLM_QUEUE_DEPTH = "gpupool:vllm_queue_depth"
FLEX_EVICTIONS = "gpupool:flex_evictions:per_minute"
PROD_PODS_PENDING = "gpupool:prod_pods_pending"
FLEX_PODS_RUNNING = "gpupool:flex_pods_running"
FLEX_HPA_AT_MAX = "gpupool:flex_hpa_at_max"
VLLM_START_TIME = "gpupool:vllm_start_time:seconds"
PROMPT_TOKENS_FROM_TIER = "gpupool:prompt_tokens_from_tier:ratio"
KV_TIER_DELETIONS = "gpupool:kv_tier_deletions:per_minute"
KV_TIER_FILL = "gpupool:kv_tier_fill:ratio"
NODE_UNALLOCATED_GPUS = "gpupool:node_unallocated_gpus"
SCHEDULABLE_GPUS = "gpupool:schedulable_gpus"
RESERVED_GPUS = "gpupool:reserved_gpus"
PRODUCTION_PENDING_GPUS = "gpupool:production_pending_gpus"
FLEX_PENDING_GPUS = "gpupool:flex_pending_gpus"
FLEX_HELD_GPUS = "gpupool:flex_held_gpus"
FLEX_HPA_STEP_GPUS = "gpupool:flex_hpa_step_gpus"
FLEX_BUDGET_STEP = "gpupool:flex_budget_step"
FLEX_SHED_GPUS = "gpupool:flex_shed_gpus"
FLEX_GROW_GPUS = "gpupool:flex_grow_gpus"

BUDGET_LABEL = "workload"
"""Label of ``gpupool:flex_gpu_budget`` naming the workload; the HPA selects on it."""
_BOUND = 'node!=""'
_UNBOUND = 'node=""'
"""kube-state-metrics' ``node`` label of a pod's requests: empty until the pod is bound."""

HPA_TOLERANCE = 0.1
"""The HPA controller's default ``--horizontal-pod-autoscaler-tolerance``: a desired/current
ratio within 10 % of 1 changes nothing, so every budget step is larger than that."""
HPA_METRIC = "gpupool_flex_gpu_budget"
"""External-metric name prometheus-adapter serves ``gpupool:flex_gpu_budget`` under."""


@dataclass(frozen=True)
class Term:
    """What one term of the flex budget records, and the policy fields it is built from."""

    help: str
    unit: str
    knobs: tuple[str, ...] = ()


_POOLS = ("cluster.pool_label", "node_pools[].name", "metrics.gpu_resource")
_SHARING = ("workloads[].gpus_per_replica", "workloads[].pool", "node_pools[].lend_idle")

TERMS: dict[str, Term] = {
    NODE_UNALLOCATED_GPUS: Term(
        "GPUs no live pod requests on each schedulable node, with its pool.", "gpus", _POOLS
    ),
    SCHEDULABLE_GPUS: Term(
        "Allocatable GPUs of the nodes of each pool that accept new pods.", "gpus", _POOLS
    ),
    PRODUCTION_PENDING_GPUS: Term(
        "GPUs production's unbound Pending pods request.", "gpus", ("priorities.production",)
    ),
    FLEX_PENDING_GPUS: Term(
        "GPUs flex's unbound Pending pods request.", "gpus", ("cluster.flex_namespace",)
    ),
    PRODUCTION_BUSY_GPUS: Term(
        "Production's busy GPU-equivalents (its GPUs' duty cycles, summed): over "
        "gpupool:production_gpus_demanded, a production trace's duty_cycle.",
        "gpus",
        ("priorities.production", "metrics.gpu_pod_labels"),
    ),
    UNALLOCATED_GPUS: Term(
        "GPUs no live pod requests on the schedulable nodes of each pool.", "gpus"
    ),
    RESERVED_GPUS: Term(
        "GPUs each pool keeps unallocated for production (0 without a reserve).",
        "gpus",
        ("node_pools[].reserve_ratio", "node_pools[].reserve"),
    ),
    PRODUCTION_GPU_UTILIZATION: Term(
        "The pools' GPU utilization from production's pods alone (flex and free GPUs count as "
        "idle); the grow/shed signal.",
        "ratio",
    ),
    SPARE_GPUS: Term(
        "Unallocated GPUs beyond every pool's reserve and pending production requests; below 0 "
        "flex sheds the difference.",
        "gpus",
    ),
    FLEX_HEADROOM_GPUS: Term(
        "GPUs flex may still grow into on each flex pool (unallocated, within the spare).",
        "gpus",
        ("node_pools[].lend_idle",),
    ),
    FLEX_HELD_GPUS: Term(
        "GPUs each flex workload's bound, not-terminating pods hold.", "gpus", ("workloads[].name",)
    ),
    FLEX_HPA_STEP_GPUS: Term(
        "The smallest change each flex workload's HPA acts on, in GPUs.",
        "gpus",
        ("workloads[].gpus_per_replica",),
    ),
    FLEX_BUDGET_STEP: Term(
        "The budget's step now (label step: shortfall, shed, grow or hold; value 1).",
        "bool",
        ("elastic.shed_while_production_above", "elastic.grow_while_production_below"),
    ),
    FLEX_SHED_GPUS: Term(
        "GPUs each flex workload sheds while the spare is short: its share of the shortfall, "
        "at least one HPA step.",
        "gpus",
        _SHARING,
    ),
    FLEX_GROW_GPUS: Term(
        "GPUs each flex workload may grow by: placeable in its pools, within their reserves "
        "and the spare, split over the workloads sharing them.",
        "gpus",
        _SHARING,
    ),
    FLEX_GPU_BUDGET: Term(
        "GPUs each flex workload may occupy; its HPA divides by gpus_per_replica.", "gpus"
    ),
}
"""The flex budget's terms (``_Builder.chain`` builds them in this order)."""


@dataclass(frozen=True)
class Query:
    """One named query: the series it is recorded as, its PromQL, and what it means."""

    record: str
    expr: str
    """What the recording rule evaluates; a budget term reads the terms before it."""
    help: str
    unit: str
    knobs: tuple[str, ...] = ()
    """The policy fields ``expr`` is built from (shown beside each rule)."""
    standalone: str | None = None
    """``expr`` with the recorded series it reads replaced by their own PromQL; None where
    ``expr`` reads exporter series only."""

    def recording_rule(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Requirement:
    """A series the catalogue reads from a source that has a row whenever the source is up
    and set up as docs/alerts.md ("What gpupool needs from the cluster") says."""

    selector: str
    fix: str
    """What to change when the source is up but this series is missing."""


@dataclass(frozen=True)
class Source:
    """An exporter the catalogue depends on, and a series whose absence means it is gone."""

    name: str
    selector: str
    requires: tuple[Requirement, ...] = ()
    """Further series of this source the catalogue needs; GpupoolMetricMissing fires for
    each one missing while ``selector`` is present (the source runs without it)."""


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
        query = self[record]
        return query.expr if query.standalone is None else query.standalone

    @property
    def budget(self) -> tuple[Query, ...]:
        """The flex budget's chain of terms, in evaluation order."""
        return tuple(q for q in self.queries if q.record in TERMS)


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
    """Composes the PromQL strings; one method per fragment several queries share.

    ``inline``: budget terms read the terms before them as PromQL, not as recorded series."""

    def __init__(self, policy: PoolPolicy, *, inline: bool = False) -> None:
        self.policy = policy
        self.inline = inline
        self.m = policy.metrics
        self.flex_ns = policy.cluster.flex_namespace
        self.window = self.m.rate_window
        self.by_instance = ", ".join(self.m.instance_labels)

    def vllm(self, name: str, matchers: str = "") -> str:
        """Selector of a vLLM metric (``name`` without prefix) of the flex instances,
        narrowed by ``matchers``."""
        extra = f", {matchers}" if matchers else ""
        return f'vllm:{name}{{namespace="{self.flex_ns}"{extra}}}'

    def kv_tier(self, name: str) -> str:
        """Selector of a snapshot GC sidecar metric (``gpupool_kv_tier_<name>``) of the flex
        pods; the sidecar runs only with ``kv_cache.kv_preservation: filesystem``."""
        return f'gpupool_kv_tier_{name}{{namespace="{self.flex_ns}"}}'

    def by_volume(self) -> str:
        """Labels of one snapshot volume: it belongs to a workload, every replica mounts it."""
        return f"namespace, {self.m.workload_label}"

    def vllm_start_time(self) -> str:
        """Unix time the vLLM API server of each instance started: ``process_start_time_seconds``
        of the very target that serves its ``vllm:`` series (``instance``), not of a sidecar
        of the same pod; the youngest where an instance has several."""
        on = ", ".join(dict.fromkeys([*self.m.instance_labels, "instance"]))
        return (
            f"max by ({self.by_instance}) "
            f'(process_start_time_seconds{{namespace="{self.flex_ns}"}}'
            f" and on ({on}) {self.vllm('prefix_cache_queries_total')})"
        )

    def node_pool(self, pools: list[NodePool]) -> str:
        """``node`` -> ``pool`` of every node labelled with one of ``pools``."""
        ksm = ksm_label(self.policy.cluster.pool_label)
        names = "|".join(p.name for p in pools)
        return (
            f'max by (node, pool) (label_replace(kube_node_labels{{{ksm}=~"{names}"}}, '
            f'"pool", "$1", "{ksm}", "(.*)"))'
        )

    def gpu_util_by_pool(self, pools: list[NodePool]) -> str:
        """Per-GPU utilization (0-1) with a ``pool`` label, joined through the node's pool label."""
        gpu = (
            f'label_replace(DCGM_FI_DEV_GPU_UTIL, "node", "$1", "{self.m.gpu_node_label}", "(.*)")'
        )
        return f"(({gpu}) / 100 * on (node) group_left (pool) {self.node_pool(pools)})"

    def cluster_utilization(self) -> str:
        return "(avg(DCGM_FI_DEV_GPU_UTIL) / 100)"

    def live_pods(self, phase: str = "Pending|Running", namespace: str | None = None) -> str:
        """1 per non-terminated pod (``phase`` a regex); the filter every GPU request joins."""
        ns = f'namespace="{namespace}", ' if namespace else ""
        return f'max by (namespace, pod) (kube_pod_status_phase{{{ns}phase=~"{phase}"}} == 1)'

    def production_pods(self) -> str:
        """1 per pod of the production PriorityClass."""
        name = self.policy.priorities.production.name
        return f'max by (namespace, pod) (kube_pod_info{{priority_class="{name}"}})'

    def gpu_requests(self, matchers: str = "") -> str:
        """GPUs each container requests (kube-state-metrics), narrowed by ``matchers``."""
        extra = f", {matchers}" if matchers else ""
        return f'kube_pod_container_resource_requests{{resource="{self.m.gpu_resource}"{extra}}}'

    def schedulable_gpus(self, pools: list[NodePool]) -> str:
        """Allocatable GPUs of each node of ``pools`` that accepts new pods, with its pool."""
        alloc = f'max by (node) (kube_node_status_allocatable{{resource="{self.m.gpu_resource}"}})'
        return (
            f"({alloc} * on (node) group_left (pool) {self.node_pool(pools)}"
            " unless on (node) (kube_node_spec_unschedulable == 1)"
            ' unless on (node) (kube_node_status_condition{condition="Ready", status="true"}'
            " == 0))"
        )

    def unallocated_by_node(self, pools: list[NodePool]) -> str:
        """GPUs no live pod requests on each schedulable node of ``pools`` (what the scheduler
        can still place): allocatable minus the requests of pods bound there, terminating
        pods included since they hold their GPUs until they exit."""
        sched = self.schedulable_gpus(pools)
        requested = (
            f"sum by (node) ({self.gpu_requests(_BOUND)}"
            f" * on (namespace, pod) group_left () {self.live_pods()})"
        )
        return (
            f"clamp_min({sched} - on (node) group_left () "
            f"sum by (node) ({requested} or on (node) (0 * {sched})), 0)"
        )

    def ref(self, record: str, label: str = "", values: Sequence[str] = ()) -> str:
        """A budget term as a later term reads it, narrowed to ``label`` in ``values``: the
        recorded series (the rules), or with ``inline`` that term's own PromQL narrowed the
        same way (the standalone query, for data no rule evaluated)."""
        if not self.inline:
            if not label:
                return record
            op = "=" if len(values) == 1 else "=~"
            return f'{record}{{{label}{op}"{"|".join(values)}"}}'
        expr = f"({self.chain()[record]()})"
        if not label:
            return expr
        keep = " or ".join(f'label_replace(vector(1), "{label}", "{v}", "", "")' for v in values)
        return f"({expr} and on ({label}) ({keep}))"

    def in_pools(self, record: str, pools: list[NodePool]) -> str:
        """``record`` (labelled ``pool``) on ``pools`` only."""
        return self.ref(record, "pool", [p.name for p in pools])

    def per_workload(self, term: Callable[[FlexWorkload], str]) -> str:
        """``term`` of every flex workload, labelled with the workload's name."""
        return " or ".join(
            f'label_replace({term(w)}, "{BUDGET_LABEL}", "{w.name}", "", "")'
            for w in self.policy.workloads
        )

    def chain(self) -> dict[str, Callable[[], str]]:
        """The budget's terms, each after the terms it reads: record -> its PromQL."""
        terms: dict[str, Callable[[], str]] = {
            NODE_UNALLOCATED_GPUS: lambda: self.unallocated_by_node(self.policy.node_pools),
            SCHEDULABLE_GPUS: lambda: (
                f"sum by (pool) ({self.schedulable_gpus(self.policy.node_pools)})"
            ),
            PRODUCTION_PENDING_GPUS: lambda: self.pending_gpus(self.production_pods()),
            FLEX_PENDING_GPUS: self.flex_pending,
            PRODUCTION_BUSY_GPUS: self.production_busy,
            UNALLOCATED_GPUS: lambda: f"sum by (pool) ({self.ref(NODE_UNALLOCATED_GPUS)})",
            RESERVED_GPUS: self.reserved,
            PRODUCTION_GPU_UTILIZATION: self.production_utilization,
            SPARE_GPUS: self.spare,
            FLEX_HEADROOM_GPUS: lambda: " or ".join(map(self.headroom, self.policy.harvest_pools)),
        }
        if self.policy.workloads:
            terms |= {
                FLEX_HELD_GPUS: lambda: self.per_workload(self.held),
                FLEX_HPA_STEP_GPUS: lambda: self.per_workload(self.hpa_step),
                FLEX_BUDGET_STEP: self.budget_step,
                FLEX_SHED_GPUS: self.shed,
                FLEX_GROW_GPUS: lambda: self.per_workload(self.grow),
                FLEX_GPU_BUDGET: self.budget,
            }
        return terms

    def reserved(self) -> str:
        """GPUs each pool keeps unallocated for production (``pool``), 0 without a reserve."""
        return " or ".join(
            f'label_replace({self.own_reserve(pool)}, "pool", "{pool.name}", "", "")'
            for pool in self.policy.node_pools
        )

    def own_reserve(self, pool: NodePool) -> str:
        """GPUs ``pool`` keeps unallocated of its own (no labels).

        ``reserve_ratio``: floor(schedulable GPUs x ratio). Slots (``reserve``): R slots of
        S GPUs are S x R while at least R nodes' worth of whole slots are free (a node with
        F free GPUs holds floor(F / S) slots), and S x (R + missing slots) while fewer are:
        the budget then sheds until whole slots are free again. 0 with no schedulable node."""
        reserve = self.policy.reserve_of(pool)
        if reserve.slots:
            size, count = reserve.slot_gpus, reserve.slots
            slots = f"sum(floor({self.in_pools(NODE_UNALLOCATED_GPUS, [pool])} / {size}))"
            return f"(({size} * ({count} + clamp_min({count} - {slots}, 0))) or vector(0))"
        if reserve.ratio <= 0:
            return "vector(0)"
        gpus = f"sum({self.in_pools(SCHEDULABLE_GPUS, [pool])})"
        return f"(floor({gpus} * {num(reserve.ratio)}) or vector(0))"

    def pending_gpus(self, pods: str) -> str:
        """GPUs requested by unbound Pending pods selected by ``pods`` (a 1-per-pod vector)."""
        return (
            f"(sum({self.gpu_requests(_UNBOUND)}"
            f" * on (namespace, pod) group_left () {self.live_pods('Pending')}"
            f" * on (namespace, pod) group_left () {pods}) or vector(0))"
        )

    def spare(self) -> str:
        """Unallocated GPUs of all pools beyond their reserves and what production waits for.

        Negative: production's burst room is under the reserve, so flex sheds the difference.
        """
        free = f"sum({self.ref(NODE_UNALLOCATED_GPUS)})"
        reserved = f"sum({self.ref(RESERVED_GPUS)})"
        return f"({free} - {reserved} - {self.ref(PRODUCTION_PENDING_GPUS)})"

    def flex_pending(self) -> str:
        flex = f'max by (namespace, pod) (kube_pod_info{{namespace="{self.flex_ns}"}})'
        return self.pending_gpus(flex)

    def spare_for_flex(self) -> str:
        """The spare less the GPUs flex pods already wait for."""
        return f"({self.ref(SPARE_GPUS)} - {self.ref(FLEX_PENDING_GPUS)})"

    def headroom(self, pool: NodePool) -> str:
        """GPUs flex may still grow into on ``pool``: its unallocated GPUs less its own
        reserve, at most the spare beyond every reserve (less flex pods already waiting),
        never below zero."""
        free = (
            f"({self.in_pools(UNALLOCATED_GPUS, [pool])}"
            f" - on (pool) {self.in_pools(RESERVED_GPUS, [pool])})"
        )
        room = self.spare_for_flex()
        # group_left keeps ``pool``: a one-to-one match on () would drop every label.
        fits = f"({free} <= on () group_left () {room})"
        capped = f"((0 * {free}) + on () group_left () {room})"
        return f"clamp_min({fits} or on () {capped}, 0)"

    def production_utilization(self) -> str:
        """The pools' GPU utilization counting production's pods only: the duty cycle of the
        GPUs production pods hold, summed, over every schedulable GPU of the pools.

        This is the "cluster GPU utilization" with flex's own load left out (flex and
        free GPUs count as idle), so flex can never shed itself. 0 when production holds no
        GPU; absent (the budget then never grows) when production holds GPUs but
        dcgm-exporter does not attribute them to pods (``metrics.gpu_pod_labels``).
        """
        return f"({self.ref(PRODUCTION_BUSY_GPUS)} / sum({self.ref(SCHEDULABLE_GPUS)}))"

    def production_held(self) -> str:
        """GPUs requested by production's bound, non-terminated pods (no labels; absent when
        it holds none)."""
        return (
            f"sum({self.gpu_requests(_BOUND)}"
            f" * on (namespace, pod) group_left () {self.live_pods()}"
            f" * on (namespace, pod) group_left () {self.production_pods()})"
        )

    def production_busy(self) -> str:
        """Production's busy GPU-equivalents: the duty cycle of each GPU its pods hold, summed;
        0 when it holds none, absent when it holds GPUs no dcgm series attributes to a pod."""
        ns, pod = self.m.gpu_pod_labels
        gpu = "DCGM_FI_DEV_GPU_UTIL"
        for want, have in (("namespace", ns), ("pod", pod)):
            if have != want:
                gpu = f'label_replace({gpu}, "{want}", "$1", "{have}", "(.+)")'
        return (
            f"(sum({gpu} / 100 * on (namespace, pod) group_left () {self.production_pods()})"
            f" or (vector(0) unless on () {self.production_held()}))"
        )

    def production_demanded(self) -> str:
        """GPUs production asks for: held by its bound pods plus requested by its pending
        ones (0 with neither, while kube-state-metrics reports pods)."""
        pending = self.pending_gpus(self.production_pods())
        return (
            f"(({self.production_held()} or vector(0)) + {pending}) and on () count(kube_pod_info)"
        )

    def held(self, workload: FlexWorkload) -> str:
        """GPUs the workload's bound, not-terminating pods request; 0 when none is bound, and
        no series when its Deployment does not exist. Pods the scheduler could not place do
        not count, so a budget never keeps replicas that only wait."""
        pods = f'pod=~"{workload.name}-[a-z0-9]+-[a-z0-9]+", namespace="{self.flex_ns}"'
        bound = (
            f"sum(({self.gpu_requests(f'{pods}, {_BOUND}')}"
            f" * on (namespace, pod) group_left () {self.live_pods(namespace=self.flex_ns)})"
            " unless on (namespace, pod) kube_pod_deletion_timestamp)"
        )
        spec = self.spec_replicas(workload)
        return f"(({bound} + 0 * {spec}) or (0 * {spec}))"

    def spec_replicas(self, workload: FlexWorkload) -> str:
        return (
            f'sum(kube_deployment_spec_replicas{{namespace="{self.flex_ns}", '
            f'deployment="{workload.name}"}})'
        )

    def hpa_step(self, workload: FlexWorkload) -> str:
        """The smallest change the HPA acts on, in GPUs: ``floor(replicas x HPA_TOLERANCE) +
        1`` replicas, since its default 10 % tolerance swallows less."""
        replicas = self.spec_replicas(workload)
        return f"((floor({replicas} * {num(HPA_TOLERANCE)}) + 1) * {workload.gpus_per_replica})"

    def sharing(self, workload: FlexWorkload) -> int:
        """Workloads that compete with ``workload`` for GPUs: those whose pools overlap its
        own (with lending, every workload shares the lending pools)."""
        mine = {p.name for p in self.policy.pools_for(workload)}
        return sum(
            1 for w in self.policy.workloads if mine & {p.name for p in self.policy.pools_for(w)}
        )

    def budget_step(self) -> str:
        """Which of the budget's four steps every workload takes now (``step``; value 1), the
        first that holds:

        1. ``shortfall``: the spare is negative (production's burst room is under the
           reserves, or production waits): shed the shortfall.
        2. ``shed``: production keeps more than ``shed_while_production_above`` of the pools'
           GPUs busy: shed one HPA step.
        3. ``grow``: production keeps less than ``grow_while_production_below`` busy: grow.
        4. ``hold``: otherwise.

        Missing data never grows flex: without production's utilization only 1 and 4 remain,
        and without the spare (no schedulable node) there is no step (the HPA holds)."""
        e = self.policy.elastic
        spare, prod = self.ref(SPARE_GPUS), self.ref(PRODUCTION_GPU_UTILIZATION)
        steps = [
            ("shortfall", f"({spare} < 0)"),
            ("shed", f"({prod} > {num(e.shed_while_production_above)})"),
            ("grow", f"({prod} < {num(e.grow_while_production_below)})"),
            ("hold", spare),
        ]
        return " or on () ".join(
            f'label_replace(vector(1) and on () {when}, "step", "{name}", "", "")'
            for name, when in steps
        )

    def shed(self) -> str:
        """GPUs each workload sheds when the spare is short: its share of the shortfall in
        whole replicas, at least one HPA step."""

        def share(w: FlexWorkload) -> str:
            g = w.gpus_per_replica
            return f"(ceil(-{self.ref(SPARE_GPUS)} / {self.sharing(w) * g}) * {g})"

        step = self.ref(FLEX_HPA_STEP_GPUS)
        # 0 + drops the step's series name: over a range (a backfill) the two branches of
        # one workload are then one series, as they are at every instant
        return f"(({self.per_workload(share)}) >= {step}) or (0 + {step})"

    def grow(self, workload: FlexWorkload) -> str:
        """GPUs ``workload`` may grow by: the smallest of the placeable GPUs of its pools (its
        flex pool and every pool that lends, whole replicas per node), those pools'
        unallocated GPUs less their reserves, and the spare less waiting flex pods; split
        over the workloads sharing those pools, in whole replicas, never below zero."""
        g, pools = workload.gpus_per_replica, self.policy.pools_for(workload)
        free = self.in_pools(NODE_UNALLOCATED_GPUS, pools)
        room = f"((sum(floor({free} / {g})) * {g}) or vector(0))"
        spare = self.spare_for_flex()
        # never into the GPUs the workload's pools keep for production
        kept = f"((sum({free}) or vector(0)) - sum({self.in_pools(RESERVED_GPUS, pools)}))"
        fit = f"(({room} <= on () {spare}) or on () {spare})"
        fit = f"(({fit} <= on () {kept}) or on () {kept})"
        return f"clamp_min(floor({fit} / {self.sharing(workload) * g}) * {g}, 0)"

    def budget(self) -> str:
        """GPUs each workload may occupy: the GPUs it holds plus the change of the budget's
        step (``budget_step``), never below zero. No series without the workload's
        Deployment or without a step (missing data: the HPA holds)."""

        def when(step: str) -> str:
            return f"on () {self.ref(FLEX_BUDGET_STEP, 'step', [step])}"

        hpa = self.ref(FLEX_HPA_STEP_GPUS)
        change = (
            f"(-{self.ref(FLEX_SHED_GPUS)} and {when('shortfall')})"
            f" or (-{hpa} and {when('shed')})"
            f" or ({self.ref(FLEX_GROW_GPUS)} and {when('grow')})"
            f" or (0 * {hpa} and {when('hold')})"
        )
        return f"clamp_min({self.ref(FLEX_HELD_GPUS)} + ({change}), 0)"

    def prod_unschedulable(self) -> str:
        """Production pods requesting GPUs the scheduler cannot place (``PodScheduled=False``,
        reason ``Unschedulable``; kube-state-metrics exports the series only while that holds),
        counted; ``0 * count(kube_pod_info)`` records 0, not nothing, while kube-state-metrics
        is up, so the tuner can tell "none waiting" from "no data"."""
        unschedulable = "(max by (namespace, pod) (kube_pod_status_unschedulable) == 1)"
        wants_gpus = f"(sum by (namespace, pod) ({self.gpu_requests()}) > 0)"
        return (
            f"(count({unschedulable} and on (namespace, pod) {wants_gpus}"
            f" and on (namespace, pod) {self.production_pods()})"
            " or (0 * count(kube_pod_info)))"
        )

    def min_queried_tokens(self) -> str:
        """Filter on an instance's queried tokens per second: ``> 0`` (no division by zero)
        or at least the policy's minimum."""
        floor = self.policy.alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s
        return f">= {num(floor)}" if floor > 0 else "> 0"

    def evictions(self) -> str:
        """Flex pods first seen disrupted within the window, per minute, by canonical reason."""
        return flex_evictions_expr(self.policy)

    def budget_terms(self) -> list[Query]:
        """The budget's chain, each term after the terms it reads (one rule group evaluates
        them in this order, so each reads the others' results of the same evaluation)."""
        inlined = _Builder(self.policy, inline=True).chain()
        queries = []
        for record, build in self.chain().items():
            expr, standalone, term = build(), inlined[record](), TERMS[record]
            alone = None if standalone == expr else standalone
            queries.append(Query(record, expr, term.help, term.unit, term.knobs, alone))
        return queries

    # The concerns, one section each: its queries and, beside each, the policy fields
    # (knobs) its expression reads. catalogue() lists them in this order.

    def gpu_queries(self) -> list[Query]:
        """GPUs (dcgm-exporter): utilization and framebuffer, shown on the dashboard."""
        all_pools = self.gpu_util_by_pool(self.policy.node_pools)
        pooled = ("cluster.pool_label", "node_pools[].name", "metrics.gpu_node_label")
        return [
            Query(
                CLUSTER_GPU_UTILIZATION,
                self.cluster_utilization(),
                "Mean utilization of every GPU dcgm-exporter reports (flex included; shown, "
                "never decided on).",
                "ratio",
            ),
            Query(
                GPU_UTILIZATION,
                all_pools,
                "Utilization of each GPU, with its pool.",
                "ratio",
                pooled,
            ),
            Query(
                POOL_GPU_UTILIZATION,
                f"avg by (pool) ({all_pools})",
                "Mean GPU utilization of each node pool.",
                "ratio",
                pooled,
            ),
            Query(
                GPU_MEMORY_USED,
                "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
                "Framebuffer share in use on each GPU.",
                "ratio",
            ),
        ]

    def capacity_queries(self) -> list[Query]:
        """Capacity beside the budget: what production demands and waits for, flex's pods
        and HPAs (kube-state-metrics)."""
        ns = self.flex_ns
        production = ("priorities.production", "metrics.gpu_resource")
        return [
            Query(
                PRODUCTION_GPUS_DEMANDED,
                self.production_demanded(),
                "GPUs production's pods hold or wait for (bound plus pending requests): the "
                "gpus_demanded of a production trace (gpupool production-trace).",
                "gpus",
                production,
            ),
            Query(
                PROD_PODS_PENDING,
                self.prod_unschedulable(),
                "Pods of the production PriorityClass that request GPUs and that the scheduler "
                "cannot place (kube_pod_status_unschedulable); 0 when none, absent without "
                "kube-state-metrics. Pending pods already bound to a node (pulling images, "
                "running init containers) do not count.",
                "pods",
                production,
            ),
            Query(
                FLEX_PODS_RUNNING,
                f'sum(kube_pod_status_phase{{namespace="{ns}", phase="Running"}})',
                "Running pods in the flex namespace.",
                "pods",
                ("cluster.flex_namespace",),
            ),
            Query(
                FLEX_HPA_AT_MAX,
                "label_replace(max by (namespace, horizontalpodautoscaler) "
                f'(kube_horizontalpodautoscaler_status_current_replicas{{namespace="{ns}"}})'
                " >= bool on (namespace, horizontalpodautoscaler) "
                "max by (namespace, horizontalpodautoscaler) "
                f'(kube_horizontalpodautoscaler_spec_max_replicas{{namespace="{ns}"}}), '
                f'"{BUDGET_LABEL}", "$1", "horizontalpodautoscaler", "(.*)")',
                "1 where a flex workload's HPA runs its maxReplicas (kube-state-metrics), else 0; "
                "the tuner widens max_replicas only there.",
                "bool",
                ("cluster.flex_namespace",),
            ),
        ]

    def eviction_queries(self) -> list[Query]:
        """Flex evictions (runtime.metrics.evictions)."""
        return [
            Query(
                FLEX_EVICTIONS,
                self.evictions(),
                "Flex pods disrupted per minute by reason (preemption, eviction-api, kubelet, "
                "node, other), each pod once: kube_pod_status_reason and (KSM >= 2.20) "
                "kube_pod_status_disruption_reason.",
                "per_minute",
                (
                    "cluster.flex_namespace",
                    "metrics.rate_window",
                    "metrics.eviction_reasons",
                    "metrics.disruption_reasons",
                ),
            ),
        ]

    def kv_cache_queries(self) -> list[Query]:
        """The flex instances' KV cache (vLLM): use, prefix-cache hits, tier loads."""
        by, w = self.by_instance, self.window
        instances = ("cluster.flex_namespace", "metrics.instance_labels")
        rated = (*instances, "metrics.rate_window")
        from_tier = self.vllm("prompt_tokens_by_source_total", 'source="external_kv_transfer"')
        return [
            Query(
                KV_CACHE_USAGE,
                f"max by ({by}) ({self.vllm('kv_cache_usage_perc')})",
                "Share of KV-cache blocks in use on each flex vLLM instance.",
                "ratio",
                instances,
            ),
            Query(
                KV_CACHE_HIT_RATE,
                f"sum by ({by}) (rate({self.vllm('prefix_cache_hits_total')}[{w}]))"
                f" / (sum by ({by}) (rate({self.vllm('prefix_cache_queries_total')}[{w}]))"
                f" {self.min_queried_tokens()})",
                "Prefix-cache hits per queried token; absent where an instance queried fewer "
                "than alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s tokens per "
                "second (or none), so a nearly idle instance never fires.",
                "ratio",
                (*rated, "alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s"),
            ),
            Query(
                PROMPT_TOKENS_FROM_TIER,
                f"sum by ({by}) (rate({from_tier}[{w}]))"
                f" / (sum by ({by}) (rate({self.vllm('prompt_tokens_total')}[{w}])) > 0)",
                "Share of each instance's prefill tokens loaded through the KV offloading "
                "connector (its host-memory and snapshot-volume tiers) instead of computed or "
                "found in the GPU prefix cache; absent where it had no prompt tokens.",
                "ratio",
                rated,
            ),
        ]

    def serving_queries(self) -> list[Query]:
        """The flex vLLM instances' serving: preemptions, queues, restarts."""
        by, w = self.by_instance, self.window
        instances = ("cluster.flex_namespace", "metrics.instance_labels")
        return [
            Query(
                VLLM_PREEMPTIONS,
                f"sum by ({by}) (rate({self.vllm('num_preemptions_total')}[{w}]))",
                "vLLM request preemptions per second (KV cache ran out) per instance.",
                "per_second",
                (*instances, "metrics.rate_window"),
            ),
            Query(
                VLLM_QUEUE_DEPTH,
                f"sum by (namespace, {self.m.workload_label}) "
                f"({self.vllm('num_requests_waiting')})",
                "Requests waiting for a slot, per flex workload.",
                "requests",
                ("cluster.flex_namespace", "metrics.workload_label"),
            ),
            Query(
                VLLM_START_TIME,
                self.vllm_start_time(),
                "Unix time each flex vLLM instance's API server process started "
                "(process_start_time_seconds of the target serving its vllm: series); "
                "KVCacheHitRateLow waits alerting.thresholds.kv_hit_rate.warmup after it. "
                "Absent where vLLM exports no process metrics (several API server processes).",
                "seconds",
                instances,
            ),
        ]

    def snapshot_queries(self) -> list[Query]:
        """The snapshot volumes (the GC sidecars; only with kv_preservation: filesystem)."""
        volume = ("cluster.flex_namespace", "metrics.workload_label")
        return [
            Query(
                KV_TIER_DELETIONS,
                f"sum by ({self.by_volume()}, reason) "
                f"(rate({self.kv_tier('deleted_files_total')}[{self.window}])) * 60",
                "Files the snapshot GCs deleted from each workload's volume per minute, by "
                "reason (abandoned_write, reclaimed, capacity); a file two GCs raced on counts "
                "in both. Only with kv_preservation: filesystem.",
                "per_minute",
                (*volume, "metrics.rate_window"),
            ),
            Query(
                KV_TIER_FILL,
                f"max by ({self.by_volume()}) ({self.kv_tier('used_bytes')}"
                f" / ({self.kv_tier('capacity_bytes')} > 0))",
                "Bytes on each workload's snapshot volume over the tier's capacity "
                "(snapshot_volume.tier_capacity), as its GCs last scanned it (the fullest "
                "view); capacity passes bring it back to 0.9. Only with kv_preservation: "
                "filesystem.",
                "ratio",
                volume,
            ),
        ]

    def catalogue(self) -> Catalogue:
        """Every concern's queries, the budget's chain first."""
        queries = [
            *self.budget_terms(),
            *self.gpu_queries(),
            *self.capacity_queries(),
            *self.eviction_queries(),
            *self.kv_cache_queries(),
            *self.serving_queries(),
            *self.snapshot_queries(),
        ]
        return Catalogue(tuple(queries), tuple(self.sources()))

    def sources(self) -> list[Source]:
        """The exporters gpupool needs, and what it reads from each (the one list of them:
        staleness and prerequisite alerts and docs/alerts.md follow it)."""
        gpu, flex = self.m.gpu_resource, self.flex_ns
        keep = "keep it out of --metric-denylist (and in --metric-allowlist if one is set)"

        def resource(name: str) -> str:
            return f"add {name} to kube-state-metrics' --resources and {keep}"

        dropped = f"kube-state-metrics drops it (its pods resource is on): {keep}"
        ksm_needs = [
            Requirement("kube_node_labels", resource("nodes")),
            Requirement(
                f'kube_node_status_allocatable{{resource="{gpu}"}}',
                f"no node advertises {gpu}: check the GPU device plugin and "
                f"metrics.gpu_resource, or {resource('nodes')}",
            ),
            Requirement("kube_pod_info", dropped),
            Requirement("kube_pod_container_resource_requests", dropped),
        ]
        if self.policy.workloads:
            ksm_needs += [
                Requirement(
                    f'kube_deployment_spec_replicas{{namespace="{flex}"}}',
                    resource("deployments"),
                ),
                Requirement(
                    f'kube_horizontalpodautoscaler_spec_max_replicas{{namespace="{flex}"}}',
                    resource("horizontalpodautoscalers"),
                ),
            ]
        dcgm_needs = (
            Requirement(
                f'up{{job=~"{self.m.dcgm_job}"}}',
                "no scrape job matches metrics.dcgm_job: set it to the job of the dcgm-exporter "
                "targets (count by (job) (DCGM_FI_DEV_GPU_UTIL)); GPUExporterDown is blind",
            ),
            *(
                Requirement(
                    field, f"add {field} to dcgm-exporter's counters CSV (it is a default counter)"
                )
                for field in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
            ),
        )
        sources = [
            Source("dcgm-exporter", "DCGM_FI_DEV_GPU_UTIL", dcgm_needs),
            Source("kube-state-metrics", "kube_pod_status_phase", tuple(ksm_needs)),
        ]
        if self.policy.workloads:
            sources.append(Source("vllm", self.vllm("kv_cache_usage_perc")))
        return sources
