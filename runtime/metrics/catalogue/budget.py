"""The flex budget: a chain of recording rules, one per term, each reading the terms before
it (docs/design/budget-rules.md), with each term's help, unit and knobs (``TERMS``).

``query()`` of the catalogue is standalone either way: ``inline`` builds a term with the
terms it reads inlined as PromQL, for data no rule evaluated. The chain is mirrored in
Python by ``runtime.sim.budget`` for the what-if engine; change both together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.metrics.catalogue.names import (
    BUDGET_LABEL,
    FLEX_BUDGET_STEP,
    FLEX_GPU_BUDGET,
    FLEX_GROW_GPUS,
    FLEX_HEADROOM_GPUS,
    FLEX_HELD_GPUS,
    FLEX_HPA_STEP_GPUS,
    FLEX_PENDING_GPUS,
    FLEX_SHED_GPUS,
    NODE_UNALLOCATED_GPUS,
    PRODUCTION_BUSY_GPUS,
    PRODUCTION_GPU_UTILIZATION,
    PRODUCTION_PENDING_GPUS,
    RESERVED_GPUS,
    SCHEDULABLE_GPUS,
    SPARE_GPUS,
    UNALLOCATED_GPUS,
)
from runtime.metrics.catalogue.promql import BOUND, Selectors, num
from runtime.metrics.catalogue.query import Query

HPA_TOLERANCE = 0.1
"""The HPA controller's default ``--horizontal-pod-autoscaler-tolerance``: a desired/current
ratio within 10 % of 1 changes nothing, so every budget step is larger than that."""


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
"""The flex budget's terms (``BudgetChain.chain`` builds them in this order)."""


class BudgetChain(Selectors):
    """Composes the budget's terms; ``inline``: terms read the terms before them as PromQL,
    not as recorded series."""

    def __init__(self, policy: PoolPolicy, *, inline: bool = False) -> None:
        super().__init__(policy)
        self.inline = inline
        self._inlined: dict[str, str] = {}
        self._sharing = policy.sharing()

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
            f"sum by (node) ({self.gpu_requests(BOUND)}"
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
        if record not in self._inlined:  # a term reads the same earlier term many times
            self._inlined[record] = f"({self.chain()[record]()})"
        expr = self._inlined[record]
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

    def spare(self) -> str:
        """Unallocated GPUs of all pools beyond their reserves and what production waits for.

        Negative: production's burst room is under the reserve, so flex sheds the difference.
        """
        free = f"sum({self.ref(NODE_UNALLOCATED_GPUS)})"
        reserved = f"sum({self.ref(RESERVED_GPUS)})"
        return f"({free} - {reserved} - {self.ref(PRODUCTION_PENDING_GPUS)})"

    def flex_pending(self) -> str:
        """GPUs requested by the flex namespace's unbound Pending pods."""
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

    def held(self, workload: FlexWorkload) -> str:
        """GPUs the workload's bound, not-terminating pods request; 0 when none is bound, and
        no series when its Deployment does not exist. Pods the scheduler could not place do
        not count, so a budget never keeps replicas that only wait."""
        pods = f'pod=~"{workload.name}-[a-z0-9]+-[a-z0-9]+", namespace="{self.flex_ns}"'
        bound = (
            f"sum(({self.gpu_requests(f'{pods}, {BOUND}')}"
            f" * on (namespace, pod) group_left () {self.live_pods(namespace=self.flex_ns)})"
            " unless on (namespace, pod) kube_pod_deletion_timestamp)"
        )
        spec = self.spec_replicas(workload)
        return f"(({bound} + 0 * {spec}) or (0 * {spec}))"

    def spec_replicas(self, workload: FlexWorkload) -> str:
        """The replicas the workload's Deployment asks for (kube-state-metrics)."""
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
        return self._sharing[workload.name]

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

    def queries(self) -> list[Query]:
        """The budget's chain, each term after the terms it reads (one rule group evaluates
        them in this order, so each reads the others' results of the same evaluation)."""
        inlined = BudgetChain(self.policy, inline=True).chain()
        queries = []
        for record, build in self.chain().items():
            expr, standalone, term = build(), inlined[record](), TERMS[record]
            alone = None if standalone == expr else standalone
            queries.append(Query(record, expr, term.help, term.unit, term.knobs, alone))
        return queries


def queries(policy: PoolPolicy) -> list[Query]:
    """The budget's chain, each term after the terms it reads."""
    return BudgetChain(policy).queries()
