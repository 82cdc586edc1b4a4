"""Property: any YAML-shaped document either validates or raises PolicyError, nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from policy import DEFAULT_POLICY, PolicyError, PoolPolicy, parse_policy

BASE: Any = YAML(typ="safe").load(DEFAULT_POLICY.read_text())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["5m", "0s", "1h30m", "gpu-flex", "prod", "flex", "Never", "-1", "auto"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            out += _paths(child, (*prefix, i))
    return out


PATHS = [p for p in _paths(BASE) if p]


def _mutate(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.heavy
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(st.tuples(st.sampled_from(PATHS), values, st.booleans()), min_size=1, max_size=4)
)
def test_mutated_documents_fail_only_with_policy_errors(
    edits: list[tuple[tuple[Any, ...], Any, bool]],
) -> None:
    import copy

    doc = copy.deepcopy(BASE)
    for path, value, delete in edits:
        try:
            doc = _mutate(doc, path, value, delete)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced the parent: skip this edit
    try:
        policy = parse_policy(doc)
    except PolicyError as exc:
        assert exc.problems
        assert all(p.message for p in exc.problems)
    else:
        assert isinstance(policy, PoolPolicy)


@settings(max_examples=200, deadline=None)
@given(doc=values)
def test_arbitrary_documents_fail_only_with_policy_errors(doc: Any) -> None:
    try:
        parse_policy(doc)
    except PolicyError as exc:
        assert exc.problems
