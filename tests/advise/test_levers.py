"""The sweep's variants: ``--vary`` parsing, field paths by name, grids and the default levers."""

from __future__ import annotations

from typing import Any

import pytest

from policy import PoolPolicy, load_policy, parse_policy
from runtime.advise.levers import (
    CURRENT,
    MAX_VARIANTS,
    MOVE_NODES,
    LeverError,
    default_variants,
    grid,
    parse_vary,
    resolve,
)
from runtime.advise.sweep import validated, variant_document


@pytest.fixture(scope="module")
def policy() -> PoolPolicy:
    return load_policy()


@pytest.fixture(scope="module")
def document(policy: PoolPolicy) -> dict[str, Any]:
    return policy.model_dump(mode="json", by_alias=True)


def test_values_are_yaml_split_outside_brackets() -> None:
    lever = parse_vary("reserve=0.1,{replicas: 2, of: inference/llama-70b-prod},[a, b],auto,true")
    assert lever.field == "reserve"
    assert lever.values == (
        0.1,
        {"replicas": 2, "of": "inference/llama-70b-prod"},
        ["a", "b"],
        "auto",
        True,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reserve_ratio", "expected FIELD=V1,V2"),
        ("=1,2", "expected FIELD=V1,V2"),
        ("a=1,,2", "empty value"),
        ("a=[1,2", "not a YAML value"),
    ],
)
def test_a_malformed_vary_says_what_is_expected(spec: str, message: str) -> None:
    with pytest.raises(LeverError, match=message):
        parse_vary(spec)


@pytest.mark.parametrize(
    ("dotted", "path"),
    [
        ("node_pools.gpu-prod.reserve_ratio", ("node_pools", 0, "reserve_ratio")),
        ("node_pools.1.max_nodes", ("node_pools", 1, "max_nodes")),
        ("gpu-flex.max_nodes", ("node_pools", 1, "max_nodes")),
        ("llama-8b-flex.max_replicas", ("workloads", 0, "max_replicas")),
        ("grow_while_production_below", ("elastic", "grow_while_production_below")),
        ("gpu-prod.nodes", ("node_pools", 0, "nodes")),
    ],
)
def test_fields_are_named_by_entry_name_index_or_label(
    document: dict[str, Any], dotted: str, path: tuple[str | int, ...]
) -> None:
    assert resolve(document, dotted) == path


@pytest.mark.parametrize(
    ("dotted", "message"),
    [
        (
            "node_pools.gpu-prod.reserve_rato",
            "has no field 'reserve_rato'; did you mean 'reserve_ratio'",
        ),
        (
            "node_pools.gpu-big.max_nodes",
            "has no entry 'gpu-big'; expected an index below 2 or one of gpu-prod, gpu-flex",
        ),
        ("elastic", "names a section, not a value"),
        ("node_pools.gpu-prod.max_nodes.x", "is a value, not a mapping or list"),
    ],
)
def test_an_unknown_field_names_what_exists(
    document: dict[str, Any], dotted: str, message: str
) -> None:
    with pytest.raises(LeverError, match=message.replace("(", r"\(")):
        resolve(document, dotted)


def test_a_grid_starts_with_the_current_policy_and_has_each_policy_once(
    policy: PoolPolicy,
) -> None:
    levers = [
        parse_vary("gpu-prod.lend_idle=true,false"),
        parse_vary("gpu-prod.reserve_ratio=0.2,0.1"),  # 0.2 and true are the current values
    ]
    variants = grid(policy, levers)
    assert variants[0] == CURRENT
    assert [v.name for v in variants] == [
        "current",
        "gpu-prod.reserve_ratio=0.1",
        "gpu-prod.lend_idle=false",
        "gpu-prod.lend_idle=false, gpu-prod.reserve_ratio=0.1",
    ]
    assert [len(v.edits) for v in variants] == [0, 1, 1, 2]


def test_slots_and_share_are_one_reserve_lever(policy: PoolPolicy) -> None:
    slots = {"replicas": 2, "of": "inference/llama-70b-prod"}
    (_, to_slots, to_share) = grid(
        policy, [parse_vary("reserve={replicas: 2, of: inference/llama-70b-prod},0.1")]
    )
    edited = parse_policy(variant_document(policy, to_slots.edits))
    assert (edited.prod_pool.reserve_ratio, edited.prod_pool.reserve.model_dump()) == (0.0, slots)  # type: ignore[union-attr]
    edited = parse_policy(variant_document(policy, to_share.edits))
    assert (edited.prod_pool.reserve_ratio, edited.prod_pool.reserve) == (0.1, None)


def test_moving_nodes_moves_names_and_limits(policy: PoolPolicy) -> None:
    (_, back, forward) = grid(policy, [parse_vary(f"{MOVE_NODES}=-1,1")])
    to_flex = parse_policy(variant_document(policy, forward.edits))
    assert (to_flex.prod_pool.max_nodes, to_flex.flex_pools[0].max_nodes) == (7, 5)
    assert (to_flex.prod_pool.nodes, to_flex.flex_pools[0].nodes) == (
        (),
        ("gpupool-worker2", "gpupool-worker"),
    )
    to_prod = parse_policy(variant_document(policy, back.edits))
    assert (to_prod.prod_pool.max_nodes, to_prod.flex_pools[0].max_nodes) == (9, 3)
    assert to_prod.prod_pool.nodes == ("gpupool-worker", "gpupool-worker2")


def test_nodes_move_only_between_pools_of_one_gpu(policy: PoolPolicy) -> None:
    document = policy.model_dump(mode="json", by_alias=True)
    document["node_pools"][1]["gpus_per_node"] = 4
    other = parse_policy(document)
    with pytest.raises(LeverError, match="hold different GPUs"):
        grid(other, [parse_vary(f"{MOVE_NODES}=1")])


def test_the_default_levers_cover_lending_reserves_nodes_thresholds(policy: PoolPolicy) -> None:
    variants = default_variants(policy)
    names = [v.name for v in variants]
    assert names[0] == "current" and len(set(names)) == len(names) <= MAX_VARIANTS
    for part in (
        "gpu-prod.lend_idle=false",
        "reserve=0.05",
        "reserve={replicas: 2, of: inference/llama-70b-prod}",
        "move_nodes=1",
        "grow_while_production_below=0.45",
        "shed_while_production_above=0.55",
    ):
        assert any(part in name for name in names), part
    # lending and the reserve form a grid: every reserve with lending off too
    assert "gpu-prod.lend_idle=false, reserve=0.05" in names
    checked = validated(policy, variants)
    assert all(isinstance(c, dict) for c in checked), [
        c for c in checked if not isinstance(c, dict)
    ]


def test_an_invalid_variant_is_reported_not_replayed(policy: PoolPolicy) -> None:
    variants = grid(policy, [parse_vary("gpu-prod.reserve_ratio=0.1,1.5")])
    checked = validated(policy, variants)
    assert isinstance(checked[1], dict)
    bad = checked[2]
    assert not isinstance(bad, dict) and bad.problem is not None
    assert bad.problem.startswith("invalid: ") and "less than or equal to 1" in bad.problem
