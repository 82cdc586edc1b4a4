"""Nodes, pods and the Kubernetes scheduler's part of the loop: placement and preemption.

A small model of what kube-scheduler does with whole-GPU pods: it binds pending pods in
priority order to a node of an allowed pool with enough unallocated GPUs. Production pods
take the pool they prefer first, then the least-allocated node (``NodeResourcesFit``'s
default ``LeastAllocated``). Flex pods (``packs``) are scored over every allowed pool the way
kube-scheduler's default plugins score the rendered Deployment: ``NodeAffinity`` (weight 2:
the preferred flex pool), ``InterPodAffinity`` (weight 2: nodes already running flex pods,
the preferred pod affinity), ``NodeResourcesFit`` (weight 1: least allocated), each
normalized to 0-100 over the feasible nodes; so flex fills its pool and the nodes that run
flex before empty ones, and what it gives back returns as whole free nodes. When none fits
and the pod may preempt (``PreemptLowerPriority``), it
picks the node whose lowest-priority pods free enough GPUs with the fewest PodDisruptionBudget
violations and victims (PDBs are honoured best-effort, as upstream does), puts the victims
into graceful termination and nominates the node for the preemptor, whose GPUs no
lower-priority pod may take meanwhile. A terminating pod holds its GPUs until its process
exits. Karpenter, where the stack's target is ``karpenter``, adds a node to a pool after its
provisioning delay when a pending pod fits nowhere and preemption cannot help, and removes
a node that stayed empty for ``consolidate_after``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Phase(Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    TERMINATING = "Terminating"
    GONE = "Gone"


@dataclass(eq=False)
class Node:
    name: str
    pool: str
    gpus: int
    free: int
    ready_at: float = 0.0
    empty_since: float | None = 0.0
    pods: set[Pod] = field(default_factory=set)


@dataclass(eq=False)
class Pod:
    """One pod of a production or flex Deployment (``owner``)."""

    uid: int
    owner: str
    production: bool
    gpus: int
    priority: int
    may_preempt: bool
    pools: tuple[str, ...]
    """Pools the pod may land on, preferred first."""
    created: float
    startup_s: float
    phase: Phase = Phase.PENDING
    node: Node | None = None
    nominated: Node | None = None
    ready_at: float = 0.0
    exit_at: float = 0.0
    pending_since: float = 0.0
    packs: bool = False
    """Scored like a flex pod: preferred pool, nodes running flex, least allocated."""


class Waiting(Enum):
    """Why a pending pod is not bound yet."""

    PREEMPTION = "preemption"
    """Nominated to a node whose victims are still exiting."""
    FRAGMENTED = "fragmented"
    """Enough GPUs are free in its pools, but on no single node."""
    CAPACITY = "capacity"
    """Its pools lack the free GPUs (or the node is still being provisioned)."""


@dataclass(frozen=True)
class Eviction:
    """A pod disrupted by someone other than its owner (here: scheduler preemption)."""

    pod: Pod
    at: float
    reason: str


@dataclass
class Cluster:
    """Nodes by pool and every live pod; mutated only through its methods."""

    nodes: dict[str, list[Node]]
    shutdown_s: float
    """Seconds a terminating pod keeps its GPUs (preStop + drain + snapshot)."""
    pdb_min_available: int
    karpenter_delay_s: float | None = None
    """Provisioning delay; None: the pool's nodes are fixed (``labels`` target)."""
    max_nodes: dict[str, int] = field(default_factory=dict)
    gpus_per_node: dict[str, int] = field(default_factory=dict)
    consolidate_after_s: float = 600.0
    pods: set[Pod] = field(default_factory=set)
    by_phase: dict[Phase, set[Pod]] = field(
        default_factory=lambda: {phase: set() for phase in Phase if phase is not Phase.GONE}
    )
    _nominated: dict[Node, set[Pod]] = field(default_factory=dict)
    _by_owner: dict[str, set[Pod]] = field(default_factory=dict)
    _uids: itertools.count[int] = field(default_factory=itertools.count)
    _names: itertools.count[int] = field(default_factory=itertools.count)
    _provisioning: list[tuple[float, str]] = field(default_factory=list)

    # -- pods -------------------------------------------------------------------------
    def create(
        self,
        *,
        owner: str,
        production: bool,
        gpus: int,
        priority: int,
        may_preempt: bool,
        pools: tuple[str, ...],
        now: float,
        startup_s: float,
        packs: bool = False,
    ) -> Pod:
        pod = Pod(
            next(self._uids),
            owner,
            production,
            gpus,
            priority,
            may_preempt,
            pools,
            now,
            startup_s,
            pending_since=now,
            packs=packs,
        )
        self.pods.add(pod)
        self.by_phase[Phase.PENDING].add(pod)
        self._by_owner.setdefault(owner, set()).add(pod)
        return pod

    def _move(self, pod: Pod, phase: Phase) -> None:
        self.by_phase[pod.phase].discard(pod)
        pod.phase = phase
        if phase is not Phase.GONE:
            self.by_phase[phase].add(pod)

    def _nominate(self, pod: Pod, node: Node | None) -> None:
        if pod.nominated is not None:
            self._nominated[pod.nominated].discard(pod)
        pod.nominated = node
        if node is not None:
            self._nominated.setdefault(node, set()).add(pod)

    def owned(self, owner: str) -> list[Pod]:
        """Pods of ``owner`` that count toward its replicas (not terminating)."""
        return [p for p in self._by_owner.get(owner, ()) if p.phase is not Phase.TERMINATING]

    def terminate(self, pod: Pod, now: float) -> None:
        """Graceful deletion: a bound pod keeps its GPUs for the shutdown budget."""
        if pod.node is None:
            self._drop(pod)
            return
        self._move(pod, Phase.TERMINATING)
        pod.exit_at = now + self.shutdown_s

    def scale_down_order(self, pods: Iterable[Pod]) -> list[Pod]:
        """The ReplicaSet controller's deletion order: unbound, then not ready, then newest."""
        rank = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2}
        return sorted(pods, key=lambda p: (rank[p.phase], -p.created, -p.uid))

    def _drop(self, pod: Pod) -> None:
        self._nominate(pod, None)
        self._move(pod, Phase.GONE)
        self.pods.discard(pod)
        self._by_owner[pod.owner].discard(pod)
        if pod.node is not None:
            pod.node.free += pod.gpus
            pod.node.pods.discard(pod)
            pod.node = None

    # -- time -------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Finish the start-ups and terminations due by ``now``; let Karpenter act."""
        for pod in [p for p in self.by_phase[Phase.STARTING] if p.ready_at <= now]:
            self._move(pod, Phase.RUNNING)
        for pod in [p for p in self.by_phase[Phase.TERMINATING] if p.exit_at <= now]:
            self._drop(pod)
        self._karpenter(now)

    # -- scheduling -------------------------------------------------------------------
    def schedule(self, now: float) -> list[Eviction]:
        """One scheduling pass over the pending pods; returns the preemptions it made."""
        evictions: list[Eviction] = []
        pending = sorted(
            self.by_phase[Phase.PENDING],
            key=lambda p: (-p.priority, p.created, p.uid),
        )
        for pod in pending:
            node = self._fit(pod, now)
            if node is not None:
                self._bind(pod, node, now)
                continue
            if pod.may_preempt and pod.nominated is None:
                evictions += self._preempt(pod, now)
            if pod.nominated is None and self.karpenter_delay_s is not None:
                self._request_node(pod, now)
        return evictions

    def _reserved(self, node: Node, below: Pod) -> int:
        """GPUs on ``node`` promised to nominated pods of higher priority than ``below``."""
        return sum(
            p.gpus
            for p in self._nominated.get(node, ())
            if p is not below and p.priority >= below.priority
        )

    def _ready_nodes(self, pool: str, now: float) -> list[Node]:
        return [n for n in self.nodes.get(pool, []) if n.ready_at <= now]

    def _fit(self, pod: Pod, now: float) -> Node | None:
        if pod.nominated is not None:
            node = pod.nominated
            return node if node.free - self._reserved(node, pod) >= pod.gpus else None
        if pod.packs:
            return self._packed(pod, now)
        for pool in pod.pools:
            fits = [
                n
                for n in self._ready_nodes(pool, now)
                if n.free - self._reserved(n, pod) >= pod.gpus
            ]
            if fits:
                return max(fits, key=lambda n: (n.free, n.name))
        return None

    def _packed(self, pod: Pod, now: float) -> Node | None:
        """The feasible node with the highest default-plugin score (module docstring)."""
        fits = [
            (pool_rank, n)
            for pool_rank, pool in enumerate(pod.pools)
            for n in self._ready_nodes(pool, now)
            if n.free - self._reserved(n, pod) >= pod.gpus
        ]
        if not fits:
            return None
        packed = {n: sum(1 for p in n.pods if p.packs) for _, n in fits}
        low, high = min(packed.values()), max(packed.values())

        def score(entry: tuple[int, Node]) -> tuple[float, int, str]:
            rank, n = entry
            affinity = 100.0 if rank == 0 else 0.0
            together = 100.0 * (packed[n] - low) / (high - low) if high > low else 0.0
            least = 100.0 * (n.free - pod.gpus) / n.gpus
            return (2 * affinity + 2 * together + least, -rank, n.name)

        return max(fits, key=score)[1]

    def waiting(self, pod: Pod, now: float) -> Waiting:
        """Why ``pod`` (pending) is not bound (``Waiting``)."""
        if pod.nominated is not None:
            return Waiting.PREEMPTION
        free = [
            n.free - self._reserved(n, pod)
            for pool in pod.pools
            for n in self._ready_nodes(pool, now)
        ]
        if sum(max(f, 0) for f in free) >= pod.gpus:
            return Waiting.FRAGMENTED
        return Waiting.CAPACITY

    def _bind(self, pod: Pod, node: Node, now: float) -> None:
        self._nominate(pod, None)
        pod.node = node
        self._move(pod, Phase.STARTING)
        pod.ready_at = now + pod.startup_s
        node.free -= pod.gpus
        node.pods.add(pod)
        node.empty_since = None

    def _preempt(self, pod: Pod, now: float) -> list[Eviction]:
        best: tuple[tuple[int, int, int], Node, list[Pod]] | None = None
        for pool in pod.pools:
            for node in self._ready_nodes(pool, now):
                plan = self._victims(pod, node)
                if plan is None:
                    continue
                victims, violations = plan
                score = (violations, len(victims), -node.free)
                if best is None or score < best[0]:
                    best = (score, node, victims)
        if best is None:
            return []
        _, node, victims = best
        self._nominate(pod, node)
        for victim in victims:
            self.terminate(victim, now)
        return [Eviction(v, now, "PreemptionByScheduler") for v in victims]

    def _victims(self, pod: Pod, node: Node) -> tuple[list[Pod], int] | None:
        """Fewest lowest-priority pods on ``node`` whose GPUs make ``pod`` fit, or None."""
        available = node.free - self._reserved(node, pod)
        available += sum(p.gpus for p in node.pods if p.phase is Phase.TERMINATING)
        candidates = sorted(
            (
                p
                for p in node.pods
                if p.priority < pod.priority and p.phase in (Phase.STARTING, Phase.RUNNING)
            ),
            key=lambda p: (p.priority, -p.created, -p.uid),
        )
        if available + sum(p.gpus for p in candidates) < pod.gpus:
            return None
        chosen: list[Pod] = []
        for victim in candidates:
            if available >= pod.gpus:
                break
            chosen.append(victim)
            available += victim.gpus
        violations = 0
        for owner in {v.owner for v in chosen}:
            left = sum(1 for p in self.owned(owner) if p.phase is Phase.RUNNING) - sum(
                1 for v in chosen if v.owner == owner and v.phase is Phase.RUNNING
            )
            violations += left < self.pdb_min_available
        return chosen, violations

    # -- karpenter --------------------------------------------------------------------
    def _request_node(self, pod: Pod, now: float) -> None:
        assert self.karpenter_delay_s is not None
        for pool in pod.pools:
            if pod.gpus > self.gpus_per_node.get(pool, 0):
                continue
            planned = len(self.nodes.get(pool, [])) + sum(
                1 for _, p in self._provisioning if p == pool
            )
            if planned >= self.max_nodes.get(pool, 0):
                continue
            waiting = [p for p in self.by_phase[Phase.PENDING] if pool in p.pools]
            booked = sum(1 for _, p in self._provisioning if p == pool)
            if booked * self.gpus_per_node[pool] >= sum(p.gpus for p in waiting):
                return
            self._provisioning.append((now + self.karpenter_delay_s, pool))
            return

    def _karpenter(self, now: float) -> None:
        if self.karpenter_delay_s is None:
            return
        due = [(t, pool) for t, pool in self._provisioning if t <= now]
        self._provisioning = [(t, pool) for t, pool in self._provisioning if t > now]
        for t, pool in due:
            gpus = self.gpus_per_node[pool]
            name = f"{pool}-k{next(self._names)}"
            self.nodes.setdefault(pool, []).append(Node(name, pool, gpus, gpus, ready_at=t))
        for nodes in self.nodes.values():
            for node in list(nodes):
                if node.pods:
                    node.empty_since = None
                    continue
                if node.empty_since is None:
                    node.empty_since = now
                elif now - node.empty_since >= self.consolidate_after_s:
                    nodes.remove(node)

    # -- views ------------------------------------------------------------------------
    def pool_gpus(self, pool: str) -> int:
        return sum(n.gpus for n in self.nodes.get(pool, []))
