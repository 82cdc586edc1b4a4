"""The flex GPU budget, evaluated in Python with the catalogue's exact semantics.

``runtime.metrics.catalogue`` turns the policy into PromQL that Prometheus evaluates in the
cluster; the what-if engine needs the same number from simulated exporter values at every
evaluation. This module mirrors ``BudgetChain.spare``, ``headroom``, ``production_utilization``,
``budget_step``, ``shed``, ``grow`` and ``budget`` term by term (same inputs, thresholds,
floors and clamps, the same "no series" outcomes), and ``tests/sim/test_budget_promql.py``
proves the two equal by writing sampled simulated states into a real Prometheus and
evaluating the catalogue's queries there, standalone and as the recorded chain of rules.
Change both together.

The terms read the exporters through ``Exports``: ``ExporterView`` holds every series (what
the PromQL test writes), and the replay's tallies (``runtime.sim.engine``) give the same
sums from the cluster's counters without a state per pod.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Literal, Protocol

from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.metrics.catalogue import HPA_TOLERANCE


@dataclass(frozen=True)
class NodeState:
    """One node as kube-state-metrics reports it.

    ``pool`` is the value of its pool label (None: not a gpupool node); ``schedulable`` is
    false for cordoned or NotReady nodes."""

    name: str
    pool: str | None
    allocatable: int
    schedulable: bool = True


@dataclass(frozen=True)
class PodState:
    """One non-terminated GPU pod: kube-state-metrics' view plus dcgm-exporter's duty cycle.

    ``node`` is None until the pod is bound; ``util_pct`` is the ``DCGM_FI_DEV_GPU_UTIL``
    of each of its GPUs (None: unbound, so no GPU reports it).
    """

    namespace: str
    name: str
    gpus: int
    phase: Literal["Pending", "Running"]
    node: str | None = None
    production: bool = False
    terminating: bool = False
    util_pct: float | None = None


class Exports(Protocol):
    """The sums the budget's queries take over kube-state-metrics and dcgm-exporter series."""

    @property
    def spec_replicas(self) -> Mapping[str, int]:
        """``kube_deployment_spec_replicas`` of each flex Deployment (absent: no series)."""
        ...

    def schedulable_gpus(self, pools: set[str]) -> int | None:
        """Allocatable GPUs of the schedulable nodes of ``pools``; None: there is none."""
        ...

    def free_gpus(self, pools: set[str], unit: int = 1) -> int:
        """``BudgetChain.unallocated_by_node`` over ``pools``: whole ``unit``s of each
        schedulable node's unallocated GPUs, summed."""
        ...

    def pending_gpus(self, *, production: bool | None, namespace: str | None) -> int:
        """GPUs of unbound Pending pods (None: any)."""
        ...

    def production_busy(self) -> float | None:
        """Production's busy GPU-equivalents (``fsum`` of its pods' duty x GPUs); None when it
        holds GPUs that no dcgm series attributes to it."""
        ...

    def held_gpus(self, namespace: str, deployment: str) -> int:
        """GPUs of the Deployment's bound pods that are not terminating."""
        ...


@dataclass(frozen=True)
class ExporterView:
    """What the budget queries read at one instant, series by series (``Exports``)."""

    nodes: tuple[NodeState, ...]
    pods: tuple[PodState, ...]
    spec_replicas: Mapping[str, int]

    def schedulable(self, pools: set[str]) -> list[NodeState]:
        return [n for n in self.nodes if n.pool in pools and n.schedulable]

    @cached_property
    def _free(self) -> dict[str, tuple[str | None, int]]:
        """Node -> (pool, GPUs no live pod requests) of every schedulable node."""
        nodes = {n.name: n.allocatable for n in self.nodes if n.schedulable}
        for pod in self.pods:
            if pod.node in nodes:
                nodes[pod.node] -= pod.gpus
        pools = {n.name: n.pool for n in self.nodes}
        return {name: (pools[name], max(free, 0)) for name, free in nodes.items()}

    def unallocated(self, pools: set[str]) -> dict[str, int]:
        """``BudgetChain.unallocated_by_node``: free GPUs per schedulable node of ``pools``."""
        return {name: free for name, (pool, free) in self._free.items() if pool in pools}

    def schedulable_gpus(self, pools: set[str]) -> int | None:
        nodes = self.schedulable(pools)
        return sum(n.allocatable for n in nodes) if nodes else None

    def free_gpus(self, pools: set[str], unit: int = 1) -> int:
        return sum(free // unit for free in self.unallocated(pools).values())

    def pending_gpus(self, *, production: bool | None, namespace: str | None) -> int:
        return sum(
            p.gpus
            for p in self.pods
            if p.node is None
            and p.phase == "Pending"
            and (production is None or p.production == production)
            and (namespace is None or p.namespace == namespace)
        )

    def production_busy(self) -> float | None:
        busy = [
            p.util_pct / 100 * p.gpus for p in self.pods if p.production and p.util_pct is not None
        ]
        holds = any(p.production and p.node is not None for p in self.pods)
        return None if holds and not busy else math.fsum(busy)

    def held_gpus(self, namespace: str, deployment: str) -> int:
        return sum(
            p.gpus
            for p in self.pods
            if p.namespace == namespace
            and of_deployment(deployment, p.name)
            and p.node is not None
            and not p.terminating
        )


def _names(pools: list[NodePool]) -> set[str]:
    return {p.name for p in pools}


def own_reserve(policy: PoolPolicy, pool: NodePool, view: Exports) -> int:
    """``BudgetChain.own_reserve``: the GPUs one pool keeps free (0 with no schedulable node).

    A share: floor(schedulable GPUs x reserve_ratio). Slots: S x R while R whole slots of S
    GPUs are free on single nodes, S x (R + missing slots) while fewer are."""
    gpus = view.schedulable_gpus({pool.name})
    reserve = policy.reserve_of(pool)
    if gpus is None:
        return 0
    if reserve.slots:
        size, count = reserve.slot_gpus, reserve.slots
        slots = view.free_gpus({pool.name}, size)
        return size * (count + max(count - slots, 0))
    if reserve.ratio <= 0:
        return 0
    return math.floor(gpus * reserve.ratio)


def reserve(policy: PoolPolicy, view: Exports, pools: list[NodePool] | None = None) -> int:
    """``BudgetChain.reserved`` of ``pools`` (default: every pool), summed."""
    chosen = policy.node_pools if pools is None else pools
    return sum(own_reserve(policy, pool, view) for pool in chosen)


def spare(policy: PoolPolicy, view: Exports) -> int | None:
    """``BudgetChain.spare``: unallocated GPUs beyond the reserves and pending production."""
    pools = _names(policy.node_pools)
    if view.schedulable_gpus(pools) is None:
        return None
    waiting = view.pending_gpus(production=True, namespace=None)
    return view.free_gpus(pools) - reserve(policy, view) - waiting


def _flex_pending(policy: PoolPolicy, view: Exports) -> int:
    return view.pending_gpus(production=None, namespace=policy.cluster.flex_namespace)


def headroom(policy: PoolPolicy, pool: NodePool, view: Exports) -> float | None:
    """``BudgetChain.headroom``: min(pool's unallocated GPUs, spare - waiting flex), at least 0."""
    room = spare(policy, view)
    if view.schedulable_gpus({pool.name}) is None or room is None:
        return None
    kept = view.free_gpus({pool.name}) - own_reserve(policy, pool, view)
    return float(max(min(kept, room - _flex_pending(policy, view)), 0))


def production_utilization(policy: PoolPolicy, view: Exports) -> float | None:
    """``BudgetChain.production_utilization``: production's busy GPU-equivalents over the pools'
    schedulable GPUs; 0 if production holds none, None when it holds GPUs that no dcgm series
    attributes to it or no node is schedulable."""
    total = view.schedulable_gpus(_names(policy.node_pools))
    busy = view.production_busy()
    if not total or busy is None:
        return None
    return busy / total


def production_demanded(view: ExporterView) -> int | None:
    """``production_demanded`` of ``runtime.metrics.catalogue.capacity``: GPUs of
    production's bound pods plus its pending ones; None without any pod (no
    kube-state-metrics series)."""
    if not view.pods:
        return None
    bound = sum(p.gpus for p in view.pods if p.production and p.node is not None)
    return bound + view.pending_gpus(production=True, namespace=None)


@cache
def _pods_of(deployment: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(deployment)}-[a-z0-9]+-[a-z0-9]+")


def of_deployment(deployment: str, pod: str) -> bool:
    """Whether ``pod`` is named as a pod of ``deployment``: ``<name>-<pod-template-hash>-
    <suffix>``."""
    return _pods_of(deployment).fullmatch(pod) is not None


def held(policy: PoolPolicy, workload: FlexWorkload, view: Exports) -> int:
    """``BudgetChain.held``: GPUs of the workload's bound pods that are not terminating."""
    return view.held_gpus(policy.cluster.flex_namespace, workload.name)


def budget(policy: PoolPolicy, workload: FlexWorkload, view: Exports) -> float | None:
    """``BudgetChain.budget``: GPUs ``workload`` may occupy, or None where PromQL has no series."""
    replicas = view.spec_replicas.get(workload.name)
    room_all = spare(policy, view)
    if replicas is None or room_all is None:
        return None
    g = workload.gpus_per_replica
    elastic = policy.elastic
    sharing = policy.sharing()[workload.name]
    step = (math.floor(replicas * HPA_TOLERANCE) + 1) * g
    prod = production_utilization(policy, view)
    change: float
    if room_all < 0:
        change = -max(math.ceil(-room_all / (sharing * g)) * g, step)
    elif prod is not None and prod > elastic.shed_while_production_above:
        change = -step
    elif prod is not None and prod < elastic.grow_while_production_below:
        pools = policy.pools_for(workload)
        names = _names(pools)
        placeable = view.free_gpus(names, g) * g
        kept = view.free_gpus(names) - reserve(policy, view, pools)
        fit = min(placeable, room_all - _flex_pending(policy, view), kept)
        change = max(math.floor(fit / (sharing * g)) * g, 0)
    else:
        change = 0
    return float(max(held(policy, workload, view) + change, 0))
