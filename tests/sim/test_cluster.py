"""The cluster's counters give the scheduler's answers node by node.

``runtime.sim.cluster`` keeps each pool's nodes in masks and its GPUs by owner so that a
choice does not walk every node. Here a small cluster (names that sort apart from their
numbers, nodes of two sizes, some not ready yet, Karpenter adding and removing nodes, pods
preempted and nominated) takes random pods and deletions, and before every scheduling pass
each pending pod's node and wait cause, each pool's sums and each owner's pods are compared
with their definitions over every node and pod.
"""

from __future__ import annotations

import random

import pytest

from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Node, Phase, Pod, Waiting


def _least_allocated(c: Cluster, pod: Pod, now: float) -> Node | None:
    for pool in pod.pools:
        fits = [n for n in c.nodes.get(pool, []) if _fits(c, n, pod, now)]
        if fits:
            return max(fits, key=lambda n: (n.free, n.name))
    return None


def _packed(c: Cluster, pod: Pod, now: float) -> Node | None:
    fits = [
        (rank, n)
        for rank, pool in enumerate(pod.pools)
        for n in c.nodes.get(pool, [])
        if _fits(c, n, pod, now)
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


def _fits(c: Cluster, node: Node, pod: Pod, now: float) -> bool:
    return node.ready_at <= now and node.free - c._reserved(node, pod) >= pod.gpus


def _waiting(c: Cluster, pod: Pod, now: float) -> Waiting:
    if pod.nominated is not None:
        return Waiting.PREEMPTION
    free = [
        n.free - c._reserved(n, pod)
        for pool in pod.pools
        for n in c.nodes.get(pool, [])
        if n.ready_at <= now
    ]
    return Waiting.FRAGMENTED if sum(max(f, 0) for f in free) >= pod.gpus else Waiting.CAPACITY


def _check(c: Cluster, now: float) -> None:
    for pod in c.by_phase[Phase.PENDING]:
        if pod.nominated is None:
            expected = _packed(c, pod, now) if pod.packs else _least_allocated(c, pod, now)
            assert c._fit(pod, now) is expected
        assert c.waiting(pod, now) is _waiting(c, pod, now)
    for pool, nodes in c.nodes.items():
        ready = [n for n in nodes if n.ready_at <= now]
        assert c.pool_gpus(pool) == sum(n.gpus for n in nodes)
        assert c.pool_free(pool) == sum(n.free for n in nodes)
        for unit in (1, 2, 3):
            sums = (sum(n.gpus for n in ready), sum(n.free // unit for n in ready))
            assert c.ready(pool, now, unit) == (sums if ready else None)
        on = [p for n in nodes for p in n.pods]
        bound, running = c.pool_owners(pool)
        for owner in c.owners():
            mine = [p for p in on if p.owner == owner]
            assert bound.get(owner, 0) == sum(p.gpus for p in mine)
            assert running.get(owner, 0) == sum(p.gpus for p in mine if p.phase is Phase.RUNNING)
    for owner in c.owners():
        pods = [p for p in c.pods if p.owner == owner and p.phase is not Phase.TERMINATING]
        assert sorted(c.owned(owner), key=lambda p: p.uid) == sorted(pods, key=lambda p: p.uid)
        for phase in (Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.TERMINATING):
            mine = [p for p in c.pods if p.owner == owner and p.phase is phase]
            assert c.count(owner, phase) == len(mine)
            assert c.gpus(owner, phase) == sum(p.gpus for p in mine)
        order = c.scale_down_order(pods)
        for count in {0, 1, len(pods) // 2, len(pods)}:
            assert c.surplus(owner, count) == order[:count]


@pytest.mark.parametrize("seed", range(4))
def test_the_counters_answer_as_the_node_walk_does(seed: int) -> None:
    rng = random.Random(seed)
    nodes = {
        "a": [Node(f"a-{i}", "a", 8, 8, ready_at=rng.choice([0.0, 0.0, 60.0])) for i in range(12)],
        "b": [Node(f"b-{i}", "b", 4, 4) for i in (1, 2, 10, 20)],
    }
    karpenter = seed % 2 == 1
    c = Cluster(
        nodes,
        shutdown_s=20.0,
        pdb_min_available=1,
        karpenter_delay_s=30.0 if karpenter else None,
        max_nodes={"a": 16, "b": 6},
        gpus_per_node={"a": 8, "b": 4},
        consolidate_after_s=40.0,
    )
    kinds = [
        ("prod", True, 1000, True, ("a", "b"), False),
        ("batch", False, 100, True, ("b", "a"), False),
        ("flex", False, -1, False, ("b", "a"), True),
        ("flex-a", False, -1, False, ("a",), True),
    ]
    names = {n.name for pool in nodes.values() for n in pool}
    nominated = preempted = 0
    for step in range(120):
        now = step * 5.0
        c.advance(now)
        names |= {n.name for pool in c.nodes.values() for n in pool}
        for _ in range(rng.randrange(7)):
            owner, production, priority, preempts, pools, packs = rng.choice(kinds)
            c.create(
                owner=owner,
                production=production,
                gpus=rng.choice([1, 1, 2, 3, 4]),
                priority=priority,
                may_preempt=preempts,
                pools=pools,
                now=now,
                startup_s=rng.choice([0.0, 10.0]),
                packs=packs,
            )
        for owner in c.owners():
            if c.live(owner) and rng.random() < 0.2:
                for pod in c.surplus(owner, rng.randrange(1, 3)):
                    c.terminate(pod, now)
        _check(c, now)
        preempted += len(c.schedule(now))
        nominated += sum(p.nominated is not None for p in c.by_phase[Phase.PENDING])
        _check(c, now)
    assert preempted and nominated, "no pod waited on a nominated node"
    if karpenter:
        added = names - {n.name for pool in nodes.values() for n in pool}
        gone = names - {n.name for pool in c.nodes.values() for n in pool}
        assert added and gone, "Karpenter neither added nor removed a node"
