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

At 10,000 GPUs a replay cannot walk every node and pod at every step, so the cluster keeps
counters as it changes: each pool's nodes in masks by (free GPUs, flex pods, GPUs), one bit
per node in name order (a choice reads a few dozen masks, and the highest bit is the
highest-named node, the tie-break), each pool's GPUs by owner, and each owner's pods by
phase in creation order (``runtime.sim.cluster_index``). Nominated nodes (GPUs promised) and
nodes not ready yet are judged one by one, as before. The nodes and pods themselves are
``runtime.sim.cluster_objects``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runtime.sim.cluster_index import NodeClass, OwnerPods, PoolIndex
from runtime.sim.cluster_objects import Eviction, Node, Phase, Pod, Waiting


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
    """Nodes with GPUs promised to pending preemptors (no empty sets)."""
    _owners: dict[str, OwnerPods] = field(default_factory=dict)
    _uids: itertools.count[int] = field(default_factory=itertools.count)
    _names: itertools.count[int] = field(default_factory=itertools.count)
    _provisioning: list[tuple[float, str]] = field(default_factory=list)
    _pools: dict[str, PoolIndex] = field(default_factory=dict, init=False)
    _unready: list[Node] = field(default_factory=list, init=False)
    """Nodes given with a ``ready_at`` ahead: the only ones that can be not ready (Karpenter
    adds nodes once they are)."""

    def __post_init__(self) -> None:
        for pool, nodes in self.nodes.items():
            self._reindex(pool)
            self._unready += [n for n in nodes if n.ready_at > 0]

    def _reindex(self, pool: str) -> None:
        index = self._pools.setdefault(pool, PoolIndex(self.nodes[pool]))
        index.index()

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
        owned = self._owners.setdefault(owner, OwnerPods(production))
        owned.order[pod] = None
        owned.phases[Phase.PENDING].add(pod)
        owned.sizes[Phase.PENDING, gpus] += 1
        return pod

    def _move(self, pod: Pod, phase: Phase) -> None:
        owned = self._owners[pod.owner]
        self.by_phase[pod.phase].discard(pod)
        owned.phases[pod.phase].discard(pod)
        owned.sizes[pod.phase, pod.gpus] -= 1
        if pod.node is not None and pod.phase is Phase.RUNNING:
            self._pools[pod.node.pool].running[pod.owner] -= pod.gpus
        pod.phase = phase
        if phase is Phase.GONE or phase is Phase.TERMINATING:
            owned.order.pop(pod, None)
        if phase is Phase.GONE:
            return
        self.by_phase[phase].add(pod)
        owned.phases[phase].add(pod)
        owned.sizes[phase, pod.gpus] += 1
        if pod.node is not None and phase is Phase.RUNNING:
            self._pools[pod.node.pool].running[pod.owner] += pod.gpus

    def _nominate(self, pod: Pod, node: Node | None) -> None:
        if pod.nominated is not None:
            promised = self._nominated[pod.nominated]
            promised.discard(pod)
            if not promised:
                del self._nominated[pod.nominated]
        pod.nominated = node
        if node is not None:
            self._nominated.setdefault(node, set()).add(pod)

    def owned(self, owner: str) -> list[Pod]:
        """Pods of ``owner`` that count toward its replicas (not terminating)."""
        owned = self._owners.get(owner)
        return [] if owned is None else list(owned.order)

    def live(self, owner: str) -> int:
        """How many pods count toward ``owner``'s replicas (``len(owned(owner))``)."""
        owned = self._owners.get(owner)
        return 0 if owned is None else len(owned.order)

    def count(self, owner: str, phase: Phase) -> int:
        """Pods of ``owner`` in ``phase``."""
        owned = self._owners.get(owner)
        return 0 if owned is None else len(owned.phases[phase])

    def sizes(self, owner: str, phase: Phase) -> dict[int, int]:
        """Pods of ``owner`` in ``phase`` by GPUs per pod."""
        owned = self._owners.get(owner)
        if owned is None:
            return {}
        return {gpus: n for (p, gpus), n in owned.sizes.items() if p is phase and n}

    def gpus(self, owner: str, phase: Phase) -> int:
        """GPUs the pods of ``owner`` in ``phase`` request."""
        return sum(gpus * n for gpus, n in self.sizes(owner, phase).items())

    def owners(self) -> dict[str, bool]:
        """Every owner that created a pod, and whether its pods are production's."""
        return {owner: owned.production for owner, owned in self._owners.items()}

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

    def surplus(self, owner: str, count: int) -> list[Pod]:
        """The first ``count`` of ``scale_down_order(owned(owner))`` without sorting the
        running pods: pending and starting ones are few, and running ones are taken newest
        first from the creation order (pods are created as the clock moves forward)."""
        owned = self._owners[owner]
        first = self.scale_down_order(
            [*owned.phases[Phase.PENDING], *owned.phases[Phase.STARTING]]
        )[:count]
        running = (p for p in reversed(owned.order) if p.phase is Phase.RUNNING)
        return first + list(itertools.islice(running, count - len(first)))

    def _drop(self, pod: Pod) -> None:
        self._nominate(pod, None)
        self._move(pod, Phase.GONE)
        self.pods.discard(pod)
        if pod.node is not None:
            self._book(pod.node, pod, -1)
            pod.node.pods.discard(pod)
            pod.node = None

    def _book(self, node: Node, pod: Pod, sign: int) -> None:
        """Take ``pod``'s GPUs on ``node`` (``sign`` 1) or give them back (-1), counters too."""
        index = self._pools[node.pool]
        index.remove(node)
        node.free -= sign * pod.gpus
        node.packed += sign * pod.packs
        index.add(node)
        index.free -= sign * pod.gpus
        index.bound[pod.owner] += sign * pod.gpus

    # -- time -------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Finish the start-ups and terminations due by ``now``; let Karpenter act."""
        self.finish_startups(now)
        for pod in [p for p in self.by_phase[Phase.TERMINATING] if p.exit_at <= now]:
            self._drop(pod)
        self._karpenter(now)

    def finish_startups(self, now: float) -> None:
        """Pods whose start-up is over by ``now`` run (a pod bound with no start-up runs in
        the step it was bound)."""
        for pod in [p for p in self.by_phase[Phase.STARTING] if p.ready_at <= now]:
            self._move(pod, Phase.RUNNING)

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

    def _fits(self, node: Node, pod: Pod, now: float) -> bool:
        return node.ready_at <= now and node.free - self._reserved(node, pod) >= pod.gpus

    def _special(self, index: PoolIndex, now: float) -> tuple[list[Node], int]:
        """The pool's nodes its masks cannot judge alone (GPUs promised to a preemptor, or not
        ready at ``now``), and their mask."""
        nodes = [
            n
            for n in dict.fromkeys(itertools.chain(self._nominated, self._unready))
            if n in index.bit and (n in self._nominated or n.ready_at > now)
        ]
        mask = 0
        for node in nodes:
            mask |= 1 << index.bit[node]
        return nodes, mask

    def _fit(self, pod: Pod, now: float) -> Node | None:
        if pod.nominated is not None:
            node = pod.nominated
            return node if node.free - self._reserved(node, pod) >= pod.gpus else None
        if pod.packs:
            return self._packed(pod, now)
        for pool in pod.pools:
            best = self._least_allocated(pool, pod, now)
            if best is not None:
                return best
        return None

    def _least_allocated(self, pool: str, pod: Pod, now: float) -> Node | None:
        """The feasible node of ``pool`` with the most free GPUs, the highest name on a tie."""
        index = self._pools.get(pool)
        if index is None:
            return None
        _, special = self._special(index, now)
        by_free: dict[int, int] = {}
        for (free, _, _), mask in index.masks.items():
            if free >= pod.gpus:
                by_free[free] = by_free.get(free, 0) | mask
        for free in sorted(by_free, reverse=True):
            mask = by_free[free]
            while mask:
                node = index.highest(mask)
                if not special >> index.bit[node] & 1 or self._fits(node, pod, now):
                    return node
                mask &= ~(1 << index.bit[node])
        return None

    def _packed(self, pod: Pod, now: float) -> Node | None:
        """The feasible node with the highest default-plugin score (module docstring): nodes
        of one class score the same, so each class offers its highest-named node."""
        fits: list[tuple[int, NodeClass, Node]] = []
        for pool_rank, pool in enumerate(pod.pools):
            index = self._pools.get(pool)
            if index is None:
                continue
            special_nodes, special = self._special(index, now)
            for key, mask in index.masks.items():
                mask &= ~special
                if key[0] >= pod.gpus and mask:
                    fits.append((pool_rank, key, index.highest(mask)))
            fits += [
                (pool_rank, (n.free, n.packed, n.gpus), n)
                for n in special_nodes
                if self._fits(n, pod, now)
            ]
        if not fits:
            return None
        low, high = min(k[1] for _, k, _ in fits), max(k[1] for _, k, _ in fits)

        def score(entry: tuple[int, NodeClass, Node]) -> tuple[float, int, str]:
            rank, (free, packed, gpus), n = entry
            affinity = 100.0 if rank == 0 else 0.0
            together = 100.0 * (packed - low) / (high - low) if high > low else 0.0
            least = 100.0 * (free - pod.gpus) / gpus
            return (2 * affinity + 2 * together + least, -rank, n.name)

        return max(fits, key=score)[2]

    def waiting(self, pod: Pod, now: float) -> Waiting:
        """Why ``pod`` (pending) is not bound (``Waiting``)."""
        if pod.nominated is not None:
            return Waiting.PREEMPTION
        free = 0
        for pool in pod.pools:
            index = self._pools.get(pool)
            if index is None:
                continue
            special_nodes, _ = self._special(index, now)
            free += index.free - sum(n.free for n in special_nodes)
            free += sum(
                max(n.free - self._reserved(n, pod), 0) for n in special_nodes if n.ready_at <= now
            )
        if free >= pod.gpus:
            return Waiting.FRAGMENTED
        return Waiting.CAPACITY

    def _bind(self, pod: Pod, node: Node, now: float) -> None:
        self._nominate(pod, None)
        pod.node = node
        self._move(pod, Phase.STARTING)
        pod.ready_at = now + pod.startup_s
        self._book(node, pod, 1)
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
            left = self.count(owner, Phase.RUNNING) - sum(
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
        changed = {pool for _, pool in due}
        for t, pool in due:
            gpus = self.gpus_per_node[pool]
            name = f"{pool}-k{next(self._names)}"
            self.nodes.setdefault(pool, []).append(Node(name, pool, gpus, gpus, ready_at=t))
        for pool, nodes in self.nodes.items():
            for node in list(nodes):
                if node.pods:
                    node.empty_since = None
                    continue
                if node.empty_since is None:
                    node.empty_since = now
                elif now - node.empty_since >= self.consolidate_after_s:
                    nodes.remove(node)
                    changed.add(pool)
        for pool in changed:
            self._reindex(pool)

    # -- views ------------------------------------------------------------------------
    def pool_gpus(self, pool: str) -> int:
        index = self._pools.get(pool)
        return 0 if index is None else index.gpus

    def pool_free(self, pool: str) -> int:
        """Unallocated GPUs of the pool's nodes."""
        index = self._pools.get(pool)
        return 0 if index is None else index.free

    def pool_owners(self, pool: str) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """GPUs on the pool's nodes by owner: of bound pods (terminating ones included), and
        of running pods."""
        index = self._pools.get(pool)
        return ({}, {}) if index is None else (index.bound, index.running)

    def ready(self, pool: str, now: float, unit: int = 1) -> tuple[int, int] | None:
        """Of the pool's nodes ready at ``now``: their GPUs, and the whole ``unit``s of
        unallocated GPUs summed per node; None: no node is ready."""
        index = self._pools.get(pool)
        if index is None:
            return None
        nodes = gpus = units = 0
        for (free, _, size), mask in index.masks.items():
            n = mask.bit_count()
            nodes, gpus, units = nodes + n, gpus + n * size, units + n * (free // unit)
        for node in self._unready:
            if node in index.bit and node.ready_at > now:
                nodes, gpus, units = nodes - 1, gpus - node.gpus, units - node.free // unit
        return (gpus, units) if nodes else None
