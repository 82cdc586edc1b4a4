"""Harvesting every GPU production leaves idle: lending, packing, slot reserves, bounds.

Replays and scheduler states built to break each rule: flex confined to its pool when
lending is off and on production's nodes when it is on, flex packed onto nodes that run flex,
free GPUs scattered so no production replica fits (reported apart from waiting for a
preemption), a slot reserve that sheds flex when fragmentation eats its slots, and a flex
bound that binds only where the policy caps it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policy import PoolPolicy, load_policy, parse_policy
from runtime.sim.budget import ExporterView, NodeState, PodState, budget, own_reserve, spare
from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Node, Pod, Waiting
from runtime.sim.engine import replay_pooled
from runtime.sim.production import ProductionRule
from runtime.sim.replay_model import FlexInput, Layout, Replay, Settings
from runtime.sim.traces import ProductionTrace
from tests.sim.test_engine import Latencies, _flat, _stream


def _policy(**changes: Any) -> PoolPolicy:
    """The shipped example without production workloads (production follows the trace),
    with ``changes`` applied as ``path=value`` (dots between the parts)."""
    document = load_policy().model_dump(mode="json")
    document["production"] = []
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return parse_policy(document)


def _pooled(policy: PoolPolicy, trace: ProductionTrace, hours: float = 2) -> Replay:
    flex = [
        FlexInput(
            policy.workloads[0],
            _stream(4096, backlog=True),
            100_000,
            Latencies(),
            backlog_window=4096,
        )
    ]
    settings = Settings(hours=hours, flex_startup_s=60, production=ProductionRule("duty"))
    return replay_pooled(policy, Layout.of_policy(policy), trace, flex, settings)


def _flex_gpu_h(replay: Replay, pool: str) -> float:
    return sum(replay.series.flex_by_pool[pool]) * replay.step_s / 3600


def test_lending_puts_flex_on_production_nodes_and_only_then() -> None:
    """Production holds 8 of gpu-prod's 64 GPUs: lending gives flex what the rest leaves
    beyond the 20 % reserve; without lending flex stays on gpu-flex."""
    trace = _flat(held=8, busy=4.0)
    lending = _pooled(_policy(), trace)
    confined = _pooled(_policy(node_pools__0__lend_idle=False), trace)
    assert _flex_gpu_h(confined, "gpu-prod") == 0
    assert _flex_gpu_h(lending, "gpu-prod") > 0
    # 64 - 8 held - 12 reserved = 44 lendable GPUs: most of them are harvested.
    tail = np.asarray(lending.series.flex_by_pool["gpu-prod"][-60:])
    assert tail.min() >= 36, tail
    assert tail.max() <= 64 - 8 - 12, "flex ate into the reserve"
    assert _flex_gpu_h(lending, "gpu-flex") >= _flex_gpu_h(confined, "gpu-flex") * 0.95


def test_explicit_bound_binds_and_auto_does_not() -> None:
    trace = _flat(held=8, busy=4.0)
    capped = _pooled(_policy(workloads__0__max_replicas=2), trace)
    auto = _pooled(_policy(), trace)
    (capped_steps,) = capped.series.capped.values()
    (auto_steps,) = auto.series.capped.values()
    assert sum(capped_steps) > 0.8 * len(capped_steps)
    assert not any(auto_steps)
    assert max(capped.series.flex_running_gpus) <= 2


def _node(name: str, pool: str, free: int) -> Node:
    return Node(name, pool, 8, free)


def _place(cluster: Cluster, node: Node, pod: Pod) -> None:
    cluster._bind(pod, node, 0.0)


def _cluster(nodes: dict[str, list[Node]]) -> Cluster:
    return Cluster(nodes=nodes, shutdown_s=30.0, pdb_min_available=0)


def _flex_pod(cluster: Cluster, pools: tuple[str, ...] = ("gpu-flex", "gpu-prod")) -> Pod:
    return cluster.create(
        owner="flex",
        production=False,
        gpus=1,
        priority=-1,
        may_preempt=False,
        pools=pools,
        now=0.0,
        startup_s=0.0,
        packs=True,
    )


def _prod_pod(cluster: Cluster, gpus: int) -> Pod:
    return cluster.create(
        owner="prod",
        production=True,
        gpus=gpus,
        priority=1_000_000,
        may_preempt=True,
        pools=("gpu-prod",),
        now=0.0,
        startup_s=0.0,
    )


def test_flex_prefers_its_pool_then_packs_lending_nodes() -> None:
    flex_node = _node("f0", "gpu-flex", 1)
    prod = [_node(f"p{i}", "gpu-prod", 8) for i in range(3)]
    cluster = _cluster({"gpu-flex": [flex_node], "gpu-prod": prod})
    first, second, third = (_flex_pod(cluster) for _ in range(3))
    cluster.schedule(0.0)
    assert first.node is flex_node, "the preferred flex pool first"
    assert second.node is not None and second.node.pool == "gpu-prod"
    assert third.node is second.node, "flex packs onto the lending node that runs flex"
    assert sum(n.free == 8 for n in prod) == 2, "two production nodes stay whole"


def test_pending_production_is_told_apart_by_cause() -> None:
    """Four GPUs free, two on each node: a 4-GPU replica is pending for fragmentation; with
    a flex pod to preempt it waits for the preemption; with two free it lacks capacity."""
    a, b = _node("p0", "gpu-prod", 8), _node("p1", "gpu-prod", 8)
    cluster = _cluster({"gpu-prod": [a, b]})
    for node in (a, b):
        _place(cluster, node, _prod_pod(cluster, 6))
    scattered = _prod_pod(cluster, 4)
    cluster.schedule(0.0)
    assert scattered.node is None
    assert cluster.waiting(scattered, 0.0) is Waiting.FRAGMENTED

    c, d = _node("p0", "gpu-prod", 8), _node("p1", "gpu-prod", 8)
    cluster = _cluster({"gpu-prod": [c, d]})
    _place(cluster, c, _prod_pod(cluster, 4))
    _place(cluster, c, _flex_pod(cluster, ("gpu-prod",)))
    _place(cluster, d, _prod_pod(cluster, 6))
    preempting = _prod_pod(cluster, 4)
    evictions = cluster.schedule(0.0)
    assert len(evictions) == 1 and preempting.node is None
    assert cluster.waiting(preempting, 0.0) is Waiting.PREEMPTION

    e = _node("p0", "gpu-prod", 8)
    cluster = _cluster({"gpu-prod": [e]})
    _place(cluster, e, _prod_pod(cluster, 6))
    short = _prod_pod(cluster, 4)
    cluster.schedule(0.0)
    assert cluster.waiting(short, 0.0) is Waiting.CAPACITY


def _view(policy: PoolPolicy, free_per_prod_node: list[int], flex_replicas: int) -> ExporterView:
    """gpu-prod's nodes with ``free`` GPUs each, the rest held by idle 1-GPU flex pods;
    gpu-flex full of flex pods; production holds nothing."""
    nodes = [NodeState(f"p{i}", "gpu-prod", 8) for i in range(len(free_per_prod_node))]
    nodes += [NodeState("f0", "gpu-flex", 8)]
    pods = []
    uid = 0
    ns, name = policy.cluster.flex_namespace, policy.workloads[0].name
    for node, free in [*zip(nodes, free_per_prod_node, strict=False), (nodes[-1], 0)]:
        for _ in range(8 - free):
            pods.append(PodState(ns, f"{name}-sim-{uid:05d}", 1, "Running", node.name, util_pct=0))
            uid += 1
    return ExporterView(tuple(nodes), tuple(pods), {name: flex_replicas})


def test_slot_reserve_keeps_whole_slots_and_sheds_when_they_are_scattered() -> None:
    """Two 4-GPU slots on gpu-prod: 8 free GPUs on one node hold both and flex holds; the
    same 8 GPUs scattered two per node hold none, and flex sheds."""
    policy = parse_policy(
        {
            **load_policy().model_dump(mode="json"),
            "node_pools": [
                {
                    **load_policy().node_pools[0].model_dump(mode="json"),
                    "reserve_ratio": 0.0,
                    "reserve": {"replicas": 2, "of": "inference/llama-70b-prod"},
                },
                load_policy().node_pools[1].model_dump(mode="json"),
            ],
        }
    )
    prod = policy.prod_pool
    whole = _view(policy, [8, 0, 0, 0], flex_replicas=32)
    scattered = _view(policy, [2, 2, 2, 2], flex_replicas=32)
    assert own_reserve(policy, prod, whole) == 8
    assert own_reserve(policy, prod, scattered) == 16, "two missing slots double the reserve"
    assert spare(policy, whole) == 0 and spare(policy, scattered) == -8
    held = 32
    assert budget(policy, policy.workloads[0], whole) == held
    assert budget(policy, policy.workloads[0], scattered) == held - 8
