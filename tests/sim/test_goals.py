"""The product's goals are scored on every replay and reported met, missed or not applicable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policy import load_policy
from runtime.sim.report import Summary, goals, summarize
from tests.sim.test_engine import _flat, _run, _stream


@pytest.fixture(scope="module")
def pooled() -> Summary:
    policy = load_policy()
    replay, _ = _run(policy, _flat(held=20, busy=6.0, hours=1), _stream(64, backlog=True), hours=1)
    return summarize(replay, policy)


def _met(summary: Summary, ratio: float = 1.0, prod_to_flex: float = 1.0) -> dict[str, object]:
    return {g.name: g.met for g in goals(summary, ratio, prod_to_flex)}


def test_each_goal_is_judged_against_its_target(pooled: Summary) -> None:
    good = replace(
        pooled,
        harvest_efficiency=0.85,
        prod_unmet_pod_minutes=0.0,
        evictions_per_minute_max=5.0,
    )
    assert _met(good, ratio=3.2, prod_to_flex=3.5) == {
        "harvest efficiency": True,
        "production pod-minutes unmet": True,
        "flex evictions per minute (max)": True,
        "useful tokens/s, pooled / fixed": True,
    }
    bad = replace(
        good, harvest_efficiency=0.79, prod_unmet_pod_minutes=0.25, evictions_per_minute_max=5.1
    )
    assert _met(bad, ratio=2.9, prod_to_flex=3.0) == {
        "harvest efficiency": False,
        "production pod-minutes unmet": False,
        "flex evictions per minute (max)": False,
        "useful tokens/s, pooled / fixed": False,
    }


@pytest.mark.parametrize("prod_to_flex", [0.5, 2.99, 4.01])
def test_the_throughput_goal_applies_only_where_production_holds_3_to_4x(
    pooled: Summary, prod_to_flex: float
) -> None:
    assert (
        _met(pooled, ratio=10.0, prod_to_flex=prod_to_flex)["useful tokens/s, pooled / fixed"]
        is None
    )
