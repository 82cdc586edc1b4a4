"""The catalogue by concern: every query names the policy fields it reads, and a change of
one of them rewrites exactly the queries that name it (the budget's chain has its own test,
tests/alerts/test_budget_rules.py)."""

from __future__ import annotations

from typing import Any

import pytest

from policy import PoolPolicy, load_policy, parse_policy
from runtime.metrics import catalogue as c


def _field(policy: PoolPolicy, knob: str) -> Any:
    """The value a knob such as ``node_pools[].name`` names (the first item of a list)."""
    value: Any = policy
    for part in knob.split("."):
        value = getattr(value, part.removesuffix("[]"))
        if part.endswith("[]"):
            value = value[0]
    return value


def test_every_knob_is_a_policy_field() -> None:
    policy = load_policy()
    for query in c.build_catalogue(policy):
        for knob in query.knobs:
            _field(policy, knob)  # AttributeError names a knob the policy lacks


def _edited(path: str, value: Any) -> PoolPolicy:
    document = load_policy().model_dump(by_alias=True, mode="json")
    *parents, leaf = path.split(".")
    node = document
    for part in parents:
        node = node[part]
    assert node[leaf] != value, f"the shipped {path} is already {value!r}"
    node[leaf] = value
    return parse_policy(document)


CHANGES = [
    ("metrics.rate_window", "10m"),
    ("metrics.gpu_node_label", "node_name"),
    ("alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s", 3.0),
    ("cluster.pool_label", "example.com/pool"),
]


@pytest.mark.parametrize(("knob", "value"), CHANGES)
def test_a_knob_rewrites_the_queries_naming_it(knob: str, value: Any) -> None:
    before, after = c.build_catalogue(load_policy()), c.build_catalogue(_edited(knob, value))
    outside = [q for q in before if q.record not in c.TERMS]
    changed = {q.record for q in outside if q.expr != after[q.record].expr}
    named = {q.record for q in outside if knob in q.knobs}
    assert changed, f"changing {knob} rewrote no query"
    assert changed == named
