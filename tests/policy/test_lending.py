"""Lending and replica bounds as the policy computes them: which pools a flex workload may
use, what ``max_replicas: auto`` resolves to, and a pool's reserve in replica slots.

The shipped policy: gpu-prod (8 nodes x 8 GPUs, lends), gpu-flex (4 nodes x 8 GPUs), one
1-GPU flex workload and a 4-GPU production workload ``inference/llama-70b-prod``.
"""

from __future__ import annotations

from typing import Any

import pytest

from policy import PolicyError, PoolPolicy, load_policy, parse_policy
from policy.effects import pool_warnings
from tests.infra.policies import policy_with


def test_the_shipped_prod_pool_lends_and_the_flex_pool_comes_first() -> None:
    policy = load_policy()
    (workload,) = policy.workloads
    assert [p.name for p in policy.lending_pools] == ["gpu-prod"]
    assert [p.name for p in policy.pools_for(workload)] == ["gpu-flex", "gpu-prod"]
    assert [p.name for p in policy.harvest_pools] == ["gpu-flex", "gpu-prod"]


def test_without_lending_a_workload_has_its_flex_pool_only() -> None:
    policy = policy_with({"node_pools.0.lend_idle": False})
    assert policy.lending_pools == []
    assert [p.name for p in policy.pools_for(policy.workloads[0])] == ["gpu-flex"]


@pytest.mark.parametrize(
    ("edits", "bound"),
    [
        ({}, 4 * 8 + 8 * 8),  # gpu-flex and the lending gpu-prod, one-GPU replicas
        ({"node_pools.0.lend_idle": False}, 4 * 8),
        # 4-GPU replicas on 6-GPU flex nodes: one per node; 2 per 8-GPU prod node
        ({"node_pools.1.gpus_per_node": 6, "workloads.0.gpus_per_replica": 4}, 4 * 1 + 8 * 2),
        (
            {
                "node_pools.0.lend_idle": False,
                "node_pools.1.gpus_per_node": 6,
                "workloads.0.gpus_per_replica": 4,
            },
            4,
        ),
    ],
    ids=["lending", "not-lending", "lending-whole-replicas", "not-lending-whole-replicas"],
)
def test_auto_max_replicas_is_what_the_pools_hold(edits: dict[str, Any], bound: int) -> None:
    policy = policy_with(edits)
    (workload,) = policy.workloads
    assert workload.max_replicas == "auto"
    assert policy.replica_capacity(workload) == bound
    assert policy.replica_bound(workload) == bound
    assert pool_warnings(policy) == []


@pytest.mark.parametrize("lend", [True, False])
@pytest.mark.parametrize("cap", [1, 10, 32])
def test_an_explicit_max_replicas_stays_a_cap(lend: bool, cap: int) -> None:
    policy = policy_with({"node_pools.0.lend_idle": lend, "workloads.0.max_replicas": cap})
    (workload,) = policy.workloads
    assert policy.replica_bound(workload) == cap < policy.replica_capacity(workload) + 1
    assert pool_warnings(policy) == []


def test_an_explicit_max_replicas_above_capacity_is_kept_and_warned() -> None:
    """Valid (a later max_nodes may make room) but warned: the extra replicas would pend."""
    policy = policy_with({"node_pools.0.lend_idle": False, "workloads.0.max_replicas": 40})
    (workload,) = policy.workloads
    assert policy.replica_bound(workload) == 40
    ((path, message),) = pool_warnings(policy)
    assert path == "workloads.0.max_replicas"
    assert "at most 32" in message and "'gpu-flex'" in message and "'gpu-prod'" not in message


def test_auto_is_at_least_min_replicas() -> None:
    """A floor above what the pools hold is the HPA's minReplicas and maxReplicas both."""
    policy = policy_with({"node_pools.0.lend_idle": False, "workloads.0.min_replicas": 40})
    assert policy.replica_capacity(policy.workloads[0]) == 32
    assert policy.replica_bound(policy.workloads[0]) == 40


def _slots(policy: PoolPolicy) -> tuple[int, int, int]:
    reserve = policy.reserve_of(policy.prod_pool)
    return reserve.slots, reserve.slot_gpus, reserve.gpus(policy.prod_pool.gpu_capacity)


def test_a_slot_reserve_takes_its_size_from_the_production_workload() -> None:
    """Two slots of llama-70b-prod's 4 GPUs: 8 GPUs kept whole, instead of a share."""
    policy = policy_with(
        {
            "node_pools.0.reserve_ratio": 0.0,
            "node_pools.0.reserve": {"replicas": 2, "of": "inference/llama-70b-prod"},
        }
    )
    assert _slots(policy) == (2, 4, 8)
    assert policy.reserve_of(policy.prod_pool).gpus(0) == 0  # no schedulable node, no slot
    assert "2 slots of 4 GPUs" in policy.reserve_of(policy.prod_pool).describe()


def test_a_ratio_reserve_is_a_share_of_the_gpus() -> None:
    policy = load_policy()
    assert policy.prod_pool.reserve is None
    reserve = policy.reserve_of(policy.prod_pool)
    assert (reserve.slots, reserve.ratio) == (0, 0.2)
    assert reserve.gpus(64) == 12  # floor(64 x 0.2)


def test_slots_up_to_what_production_floor_leaves_fit() -> None:
    """gpu-prod holds 8 nodes x 2 slots of 4 GPUs; production's floor (2 x 4 GPUs) must stay
    outside the reserve, so 14 slots fit and a 15th does not (17 would not fit the nodes
    at all: tests/policy/test_rejections.py)."""
    policy = policy_with(
        {
            "node_pools.0.reserve_ratio": 0.0,
            "node_pools.0.reserve": {"replicas": 14, "of": "inference/llama-70b-prod"},
        }
    )
    assert _slots(policy) == (14, 4, 56)
    with pytest.raises(PolicyError, match=r"production.0.min_replicas: .*reserve 15 slots of 4"):
        policy_with(
            {
                "node_pools.0.reserve_ratio": 0.0,
                "node_pools.0.reserve": {"replicas": 15, "of": "inference/llama-70b-prod"},
            }
        )


def _three_workloads_two_flex_pools(lend: bool) -> PoolPolicy:
    document = load_policy().model_dump(mode="json", by_alias=True)
    document["node_pools"][0]["lend_idle"] = lend
    document["node_pools"].append({**document["node_pools"][1], "name": "gpu-flex-b", "nodes": []})
    template = document["workloads"][0]
    document["workloads"] = [
        {**template, "name": name, "pool": pool}
        for name, pool in (("a", "gpu-flex"), ("b", "gpu-flex"), ("c", "gpu-flex-b"))
    ]
    return parse_policy(document)


@pytest.mark.parametrize(
    ("lend", "expected"), [(True, {"a": 3, "b": 3, "c": 3}), (False, {"a": 2, "b": 2, "c": 1})]
)
def test_workloads_share_the_pools_they_overlap_on(lend: bool, expected: dict[str, int]) -> None:
    """The budget splits a pool's room over the workloads that may use it: with lending the
    lending pool joins every workload, without it only a flex pool's own workloads share."""
    policy = _three_workloads_two_flex_pools(lend)
    assert policy.sharing() == expected
    for w in policy.workloads:  # the definition, counted directly
        mine = {p.name for p in policy.pools_for(w)}
        overlapping = [x for x in policy.workloads if mine & {p.name for p in policy.pools_for(x)}]
        assert len(overlapping) == expected[w.name]
