"""The trade-off on constructed summaries: the Pareto front and the pick, rule by rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policy import PoolPolicy, load_policy
from runtime.advise.front import harm, rate, recommend
from runtime.advise.levers import CURRENT, Variant
from runtime.advise.sweep import Point
from runtime.sim.report import Summary, summarize
from runtime.tuner.yamledit import ValueEdit
from tests.sim.test_headline import _flat, _ints, _replay


@pytest.fixture(scope="module")
def base() -> Summary:
    """An hour of 16 GPUs, production busy on 4 GPU-equivalents (4 busy GPU-hours)."""
    policy: PoolPolicy = load_policy()
    replay = _replay(
        "pooled", total=_ints(16), prod_busy=_flat(4.0), flex_running=_ints(8), flex_duty=_flat(1.0)
    )
    return summarize(replay, policy)


def _point(base: Summary, name: str, edits: int = 1, **figures: float) -> Point:
    variant = (
        CURRENT
        if name == "current"
        else Variant(tuple(ValueEdit(("x", i), i) for i in range(edits)), name)
    )
    return Point(variant, replace(base, **figures))  # type: ignore[arg-type]


def test_harm_adds_short_gpu_hours_and_pending_pod_minutes(base: Summary) -> None:
    assert harm(replace(base, prod_short_gpu_h=0.5, prod_unmet_pod_minutes=2.0)) == 2.5


def test_the_front_keeps_what_nothing_dominates(base: Summary) -> None:
    points = [
        _point(base, "current", harvested_gpu_h=10.0, prod_unmet_pod_minutes=1.0),
        _point(base, "more, same harm", harvested_gpu_h=12.0, prod_unmet_pod_minutes=1.0),
        _point(base, "less, no harm", harvested_gpu_h=5.0, prod_unmet_pod_minutes=0.0),
        _point(base, "less, more harm", harvested_gpu_h=9.0, prod_unmet_pod_minutes=3.0),
        _point(base, "most, most harm", harvested_gpu_h=20.0, prod_unmet_pod_minutes=9.0),
    ]
    rated = rate(points, base)
    front = {r.point.variant.name for r in rated if r.on_front}
    assert front == {"more, same harm", "less, no harm", "most, most harm"}


def test_the_pick_harvests_most_where_production_is_no_worse_off(base: Summary) -> None:
    """Allowed: busy GPU-hours short up to 0.004 (0.1 % of 4), the current policy's 1.0
    pod-minutes pending, 5 evictions a minute."""
    points = [
        _point(base, "current", harvested_gpu_h=10.0, prod_unmet_pod_minutes=1.0),
        _point(base, "short", harvested_gpu_h=30.0, prod_short_gpu_h=0.01),
        _point(base, "waits", harvested_gpu_h=25.0, prod_unmet_pod_minutes=1.5),
        _point(base, "evicts", harvested_gpu_h=20.0, evictions_per_minute_max=6.0),
        _point(base, "best", harvested_gpu_h=15.0, prod_short_gpu_h=0.003),
        _point(base, "fine", harvested_gpu_h=14.0),
    ]
    rated = rate(points, base)
    refused = {r.point.variant.name: r.refused for r in rated}
    assert refused == {
        "current": None,
        "short": "production short",
        "waits": "production waits longer",
        "evicts": "evictions over 5/min",
        "best": None,
        "fine": None,
    }
    pick = recommend(rated)
    assert pick is not None and pick.point.variant.name == "best"


def test_ties_go_to_less_harm_then_fewer_changes(base: Summary) -> None:
    points = [
        _point(base, "current", harvested_gpu_h=10.0, prod_unmet_pod_minutes=1.0),
        _point(base, "harmful", harvested_gpu_h=12.0, prod_unmet_pod_minutes=0.5),
        _point(base, "gentle", edits=3, harvested_gpu_h=12.0, prod_unmet_pod_minutes=0.2),
        _point(base, "simple", edits=1, harvested_gpu_h=12.0, prod_unmet_pod_minutes=0.2),
    ]
    pick = recommend(rate(points, base))
    assert pick is not None and pick.point.variant.name == "simple"


def test_no_pick_when_every_variant_harms_production(base: Summary) -> None:
    points = [
        _point(base, "current", harvested_gpu_h=10.0, prod_short_gpu_h=1.0),
        _point(base, "other", harvested_gpu_h=12.0, prod_short_gpu_h=2.0),
    ]
    assert recommend(rate(points, base)) is None


def test_points_without_a_replay_are_not_rated(base: Summary) -> None:
    points = [
        _point(base, "current", harvested_gpu_h=10.0),
        Point(Variant((), "skipped"), problem="not reached in the 5 s budget"),
    ]
    assert [r.point.variant.name for r in rate(points, base)] == ["current"]


def test_the_front_line_says_whether_the_current_policy_is_on_it(base: Summary) -> None:
    from runtime.advise.report import front_line

    on = [
        _point(base, "current", harvested_gpu_h=10.0, prod_unmet_pod_minutes=0.0),
        _point(base, "more, more harm", harvested_gpu_h=12.0, prod_unmet_pod_minutes=1.0),
    ]
    assert front_line(rate(on, base)).startswith("Front: the current policy is on the Pareto")
    off = [
        _point(base, "current", harvested_gpu_h=10.0, prod_unmet_pod_minutes=1.0),
        _point(base, "a bit more", harvested_gpu_h=11.0, prod_unmet_pod_minutes=1.0),
        _point(base, "most", harvested_gpu_h=14.0, prod_unmet_pod_minutes=0.5),
        _point(base, "more, more harm", harvested_gpu_h=20.0, prod_unmet_pod_minutes=2.0),
    ]
    assert front_line(rate(off, base)) == (
        "Front: the current policy is NOT on the Pareto front of its sweep: most harvests "
        "+4.0 GPU-h with no more production harm (2 variants beat it)."
    )
