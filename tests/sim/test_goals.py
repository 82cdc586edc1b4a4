"""The product's goals are scored on every replay and reported met, missed or not applicable;
each flips at its threshold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policy import load_policy
from runtime.sim.goals import goals
from runtime.sim.report import Summary, summarize
from tests.sim.test_engine import _flat, _run, _stream

RATIO = "useful GPU-hours, pooled / fixed"
HARVEST = "harvest efficiency"
SHORT = "production busy GPU-hours short"
EVICTIONS = "flex evictions per minute (max)"


@pytest.fixture(scope="module")
def replays() -> tuple[Summary, Summary]:
    policy = load_policy()
    pooled, fixed = _run(
        policy, _flat(held=20, busy=6.0, hours=1), _stream(64, backlog=True), hours=1
    )
    return summarize(pooled, policy), summarize(fixed, policy)


@pytest.fixture
def good(replays: tuple[Summary, Summary]) -> tuple[Summary, Summary]:
    """Every goal met exactly at its threshold."""
    pooled, fixed = replays
    fixed = replace(fixed, cluster_duty_cycle=0.30, prod_short_gpu_h=1.0)
    pooled = replace(
        pooled,
        harvest_efficiency=0.85,
        prod_busy_gpu_h=1000.0,
        prod_short_gpu_h=2.0,  # fixed's 1.0 + 0.1 % of 1000
        evictions_per_minute_max=5.0,
    )
    return pooled, fixed


def _met(pooled: Summary, fixed: Summary, ratio: float = 2.5) -> dict[str, bool | None]:
    return {g.name: g.met for g in goals(pooled, fixed, ratio)}


def test_each_goal_is_met_at_its_threshold(good: tuple[Summary, Summary]) -> None:
    assert _met(*good) == {RATIO: True, HARVEST: True, SHORT: True, EVICTIONS: True}


@pytest.mark.parametrize(
    ("name", "pooled_changes", "ratio"),
    [
        (RATIO, {}, 2.49),
        (HARVEST, {"harvest_efficiency": 0.849}, 2.5),
        (SHORT, {"prod_short_gpu_h": 2.01}, 2.5),
        (EVICTIONS, {"evictions_per_minute_max": 5.01}, 2.5),
    ],
)
def test_each_goal_is_missed_just_past_its_threshold(
    good: tuple[Summary, Summary], name: str, pooled_changes: dict[str, float], ratio: float
) -> None:
    pooled, fixed = good
    met = _met(replace(pooled, **pooled_changes), fixed, ratio)  # type: ignore[arg-type]
    assert met[name] is False
    assert all(m is True for n, m in met.items() if n != name), met


def test_the_ratio_goal_applies_only_where_the_fixed_cluster_idles(
    good: tuple[Summary, Summary],
) -> None:
    pooled, fixed = good
    busier = replace(fixed, cluster_duty_cycle=0.3001)
    assert _met(pooled, busier, ratio=10.0)[RATIO] is None
    assert _met(pooled, busier, ratio=1.0)[RATIO] is None
    (goal, *_) = goals(pooled, busier, 1.0)
    assert "30.0%" in goal.value


def test_no_gpu_hours_to_harvest_is_not_a_miss(good: tuple[Summary, Summary]) -> None:
    pooled, fixed = good
    assert _met(replace(pooled, harvest_efficiency=None), fixed)[HARVEST] is None


def test_the_production_allowance_grows_with_production_busy_gpu_hours(
    good: tuple[Summary, Summary],
) -> None:
    pooled, fixed = good
    # 1.0 fixed + 0.1 % of 2000 = 3.0
    assert _met(replace(pooled, prod_short_gpu_h=3.0, prod_busy_gpu_h=2000.0), fixed)[SHORT]
    assert not _met(replace(pooled, prod_short_gpu_h=3.0), fixed)[SHORT]
