"""The HPA port decides like the Kubernetes controller: table-driven, like horizontal_test.go.

Cases come from the Kubernetes HPA documentation ("Algorithm details", "Stabilization
window", "Scaling policies", "Default Behavior" and the v1.33 tolerance post) and from
gpupool's own HPA (``infra.builders.workload.autoscaler`` with the default policy). Each
case runs the closed loop the simulator runs: every sync's answer becomes the next sync's
``spec.replicas``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from infra.builders.production import autoscaler as production_autoscaler
from infra.builders.workload import autoscaler
from policy import PoolPolicy, load_policy
from policy.quantity import parse_quantity
from runtime.sim.hpa import (
    SYNC_PERIOD_S,
    HpaState,
    Recommendation,
    ScaleEvent,
    external_metric_milli,
    reconcile,
)
from runtime.sim.hpa_spec import (
    DEFAULT_SCALE_DOWN_POLICIES,
    DEFAULT_SCALE_UP_POLICIES,
    HpaSpec,
    ScalingPolicy,
)

Step = tuple[float, float | None, int]
"""(sync time in s, External metric value or None when missing, replicas after the sync)."""


def spec(**overrides: Any) -> HpaSpec:
    """A one-GPU-per-replica HPA with Kubernetes' default behavior, then ``overrides``."""
    fields: dict[str, Any] = {"min_replicas": 1, "max_replicas": 100, "target_average_value": 1.0}
    return HpaSpec(**(fields | overrides))


def pods(value: int, period_s: int) -> ScalingPolicy:
    return ScalingPolicy("Pods", value, period_s)


def percent(value: int, period_s: int) -> ScalingPolicy:
    return ScalingPolicy("Percent", value, period_s)


def every_sync(
    start_s: int, stop_s: int, metric: float | None, replicas: Callable[[int], int]
) -> list[Step]:
    """One step per sync period in ``[start_s, stop_s)``, expecting ``replicas(t)``."""
    return [(float(t), metric, replicas(t)) for t in range(start_s, stop_s, SYNC_PERIOD_S)]


def run(hpa: HpaSpec, start: int, steps: Sequence[Step]) -> list[int]:
    """Sync at each step's time with the previous answer as the current replica count."""
    state = HpaState()
    current = start
    seen = []
    for now_s, metric, _ in steps:
        current = reconcile(hpa, state, now_s=now_s, current_replicas=current, metric=metric)
        seen.append(current)
    return seen


def changes(hpa: HpaSpec, start: int, metric: float, horizon_s: int) -> list[tuple[int, int]]:
    """(time, new replica count) of every change over ``horizon_s`` of syncs at a steady metric."""
    state = HpaState()
    current = start
    found = []
    for t in range(0, horizon_s, SYNC_PERIOD_S):
        new = reconcile(hpa, state, now_s=t, current_replicas=current, metric=metric)
        if new != current:
            found.append((t, new))
        current = new
    return found


@dataclass(frozen=True)
class Case:
    name: str
    hpa: HpaSpec
    start: int
    steps: Sequence[Step]


NO_DOWN_WINDOW = spec(scale_down_stabilization_s=0)

STEP_CASES = [
    # "Algorithm details": 200m against a 100m target doubles, 50m halves (4 pods in total).
    Case("docs: ratio 2.0 doubles", spec(target_average_value=0.1), 4, [(0, 4 * 0.2, 8)]),
    Case(
        "docs: ratio 0.5 halves",
        spec(target_average_value=0.1, scale_down_stabilization_s=0),
        4,
        [(0, 4 * 0.05, 2)],
    ),
    # "... skips any scaling action if the ratio is sufficiently close to 1.0 (0.1 by default)".
    Case(
        "docs: ratios 1.05 and 0.95 are within the tolerance",
        spec(target_average_value=0.1, scale_down_stabilization_s=0),
        4,
        [(0, 4 * 0.105, 4), (15, 4 * 0.095, 4)],
    ),
    # v1.33 tolerance post: 50 replicas at 90 % against 75 %, ratio 1.2, go to 60.
    Case(
        "blog: 50 replicas at ratio 1.2 go to 60",
        spec(target_average_value=0.75),
        50,
        [(0, 50 * 0.9, 60)],
    ),
    # A budget of one replica more: 11/10 is exactly 1 + tolerance, 10/9 is beyond it.
    Case("10 replicas: +1 replica of budget is swallowed", spec(), 10, [(0, 11.0, 10)]),
    Case("9 replicas: +1 replica of budget scales", spec(), 9, [(0, 10.0, 10)]),
    Case("10 replicas: -1 replica of budget is swallowed", NO_DOWN_WINDOW, 10, [(0, 9.0, 10)]),
    Case("9 replicas: -1 replica of budget scales", NO_DOWN_WINDOW, 9, [(0, 8.0, 8)]),
    Case(
        "2 GPUs per replica: +-1 replica of budget at 10 replicas is swallowed",
        spec(target_average_value=2.0),
        10,
        [(0, 22.0, 10), (15, 18.0, 10), (30, 24.0, 12)],
    ),
    Case(
        "2 GPUs per replica: +1 replica of budget at 9 replicas scales",
        spec(target_average_value=2.0),
        9,
        [(0, 20.0, 10)],
    ),
    Case("tolerance 0: +1 replica of budget scales", spec(tolerance=0.0), 10, [(0, 11.0, 11)]),
    # Scale-up window 180 s: the lowest recommendation of the last 180 s is the seed (2).
    Case(
        "scale-up stabilization 180 s delays a rise",
        spec(scale_up_stabilization_s=180),
        2,
        [*every_sync(0, 180, 4.0, lambda t: 2), (180, 4.0, 4)],
    ),
    # "Stabilization window": scaling down uses the highest recommendation of the window.
    Case(
        "scale-down stabilization 300 s keeps the max",
        spec(scale_down_stabilization_s=300),
        10,
        [
            (0, 10.0, 10),
            (60, 6.0, 10),
            (120, 8.0, 10),
            (240, 4.0, 10),
            (300, 4.0, 8),
            (420, 4.0, 4),
        ],
    ),
    # recordInitialRecommendation: a fresh controller holds the current count for one window.
    Case(
        "the first scale-down window is seeded with the current replicas",
        spec(scale_down_stabilization_s=300),
        6,
        [(0, 2.0, 6), (285, 2.0, 6), (300, 2.0, 2)],
    ),
    Case("missing metric holds", spec(), 5, [(0, None, 5), (15, None, 5), (30, 9.0, 9)]),
    Case(
        "above maxReplicas goes to max even without a metric",
        spec(max_replicas=8),
        12,
        [(0, None, 8)],
    ),
    Case(
        "below minReplicas goes to min even without a metric",
        spec(min_replicas=2),
        1,
        [(0, None, 2)],
    ),
    Case(
        "spec.replicas 0 with minReplicas 1 disables scaling",
        spec(),
        0,
        [(0, 5.0, 0), (15, None, 0)],
    ),
    # minReplicas 0 (the HPAScaleToZero gate): no pods, so the ratio is +Inf and the budget
    # alone decides; back to zero waits for the scale-down window like any shrink.
    Case("minReplicas 0 scales up from zero", spec(min_replicas=0), 0, [(0, 3.0, 3), (15, 0.0, 3)]),
    Case("the budget is clamped to maxReplicas", spec(max_replicas=5), 2, [(0, 50.0, 5)]),
    Case(
        "the budget is clamped to minReplicas",
        spec(min_replicas=2, scale_down_stabilization_s=0),
        3,
        [(0, 0.0, 2)],
    ),
    Case(
        "selectPolicy Disabled never scales down",
        spec(scale_down_stabilization_s=0, scale_down_select="Disabled"),
        6,
        [(0, 1.0, 6), (600, 1.0, 6), (615, 9.0, 9)],
    ),
    Case(
        "selectPolicy Disabled never scales up",
        spec(scale_up_select="Disabled", scale_down_stabilization_s=0),
        3,
        [(0, 9.0, 3), (15, 1.0, 1)],
    ),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=[c.name for c in STEP_CASES])
def test_sync_by_sync(case: Case) -> None:
    assert run(case.hpa, case.start, case.steps) == [expected for *_, expected in case.steps]


@dataclass(frozen=True)
class Trajectory:
    name: str
    hpa: HpaSpec
    start: int
    metric: float
    horizon_s: int
    changes: list[tuple[int, int]]


DOCS_POLICIES = (pods(4, 60), percent(10, 60))

TRAJECTORIES = [
    # "Scaling policies": 80 replicas to 10; Percent (8 pods) wins above 40 replicas, Pods
    # (4) below; 10 % of 72 is 7.2, rounded up to 8. A step holds while its pods are inside
    # the 60 s period (periodStartReplicas), so the next step comes a minute later.
    Trajectory(
        "docs: 4 pods or 10 % per minute, Max",
        spec(scale_down_stabilization_s=0, scale_down_policies=DOCS_POLICIES),
        80,
        10.0,
        900,
        [
            (0, 72),
            (60, 64),
            (120, 57),
            (180, 51),
            (240, 45),
            (300, 40),
            (360, 36),
            (420, 32),
            (480, 28),
            (540, 24),
            (600, 20),
            (660, 16),
            (720, 12),
            (780, 10),
        ],
    ),
    # "Example: limit scale down rate": 10 % per minute but no more than 5 pods (Min). The
    # run stops at 11: 10/11 is within the tolerance.
    Trajectory(
        "docs: 10 % or 5 pods per minute, Min",
        spec(
            scale_down_stabilization_s=0,
            scale_down_policies=(percent(10, 60), pods(5, 60)),
            scale_down_select="Min",
        ),
        80,
        10.0,
        1500,
        [
            (0, 75),
            (60, 70),
            (120, 65),
            (180, 60),
            (240, 55),
            (300, 50),
            (360, 45),
            (420, 40),
            (480, 36),
            (540, 32),
            (600, 28),
            (660, 25),
            (720, 22),
            (780, 19),
            (840, 17),
            (900, 15),
            (960, 13),
            (1020, 11),
        ],
    ),
    # A Percent scale-up rounds up, or 10 % of 1 replica would never add one.
    Trajectory(
        "Percent 10 per 60 s rounds a rise up",
        spec(scale_up_policies=(percent(10, 60),)),
        1,
        4.0,
        300,
        [(0, 2), (60, 3), (120, 4)],
    ),
    # "Default Behavior": 4 pods or 100 % every 15 s, whichever is more.
    Trajectory("docs: default scale-up", spec(), 1, 20.0, 120, [(0, 5), (15, 10), (30, 20)]),
    Trajectory(
        "Pods policy 1 per 60 s sheds 10 to 5 a pod a minute",
        spec(scale_down_stabilization_s=0, scale_down_policies=(pods(1, 60),)),
        10,
        5.0,
        600,
        [(0, 9), (60, 8), (120, 7), (180, 6), (240, 5)],
    ),
]


@pytest.mark.parametrize("case", TRAJECTORIES, ids=[c.name for c in TRAJECTORIES])
def test_trajectory(case: Trajectory) -> None:
    assert changes(case.hpa, case.start, case.metric, case.horizon_s) == case.changes


# --- gpupool's own HPA ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy() -> PoolPolicy:
    return load_policy()


@pytest.fixture(scope="module")
def rendered(policy: PoolPolicy) -> dict[str, Any]:
    """The HPA infra renders for the default policy's first workload."""
    return autoscaler(policy, policy.workloads[0])


def test_from_manifest_reads_the_rendered_hpa(policy: PoolPolicy, rendered: dict[str, Any]) -> None:
    workload, scaling = policy.workloads[0], policy.autoscaling
    assert HpaSpec.from_manifest(rendered) == HpaSpec(
        min_replicas=workload.min_replicas,
        max_replicas=policy.replica_bound(workload),
        target_average_value=float(workload.gpus_per_replica),
        scale_up_stabilization_s=scaling.scale_up_stabilization_s,
        scale_down_stabilization_s=scaling.scale_down_stabilization_s,
        scale_up_policies=(pods(scaling.scale_up_pods_per_minute, 60),),
        scale_down_policies=(pods(scaling.scale_down_pods_per_minute, 60),),
        scale_up_select="Max",
        scale_down_select="Max",
    )
    assert HpaSpec.from_manifest(rendered, tolerance=0.05).tolerance == 0.05


def test_behavior_tolerance_replaces_the_controller_flag_per_direction(policy: PoolPolicy) -> None:
    """``gpupool:hpaTolerance: behavior`` renders tolerance 0 both ways: a one-replica step
    at 20 replicas (5 %) is taken, where the controller's 10 % swallows it."""
    workload = policy.workloads[0].model_copy(update={"max_replicas": 40})
    flag = HpaSpec.from_manifest(autoscaler(policy, workload))
    per_hpa = HpaSpec.from_manifest(autoscaler(policy, workload, "behavior"))
    assert (per_hpa.scale_up_tolerance, per_hpa.scale_down_tolerance) == (0.0, 0.0)
    g = workload.gpus_per_replica
    for spec, grows in ((flag, False), (per_hpa, True)):
        state = HpaState()
        reconcile(spec, state, now_s=0, current_replicas=20, metric=20.0 * g)
        after = reconcile(spec, state, now_s=600, current_replicas=20, metric=21.0 * g)
        assert (after == 21) is grows, (spec, after)


def test_rendered_hpa_waits_its_windows_and_keeps_its_rates(
    policy: PoolPolicy, rendered: dict[str, Any]
) -> None:
    hpa = HpaSpec.from_manifest(rendered)
    scaling = policy.autoscaling
    top = min(hpa.max_replicas, 8)  # within the bound, where the 10 % tolerance binds no step
    gpus = hpa.target_average_value
    up_at = scaling.scale_up_stabilization_s
    down_at = scaling.scale_down_stabilization_s
    rise = changes(hpa, 1, top * gpus, 900)
    assert rise[0] == (up_at, 1 + scaling.scale_up_pods_per_minute)
    assert [t for t, _ in rise] == [up_at + 60 * i for i in range(len(rise))]
    assert rise[-1][1] == top
    shed = changes(hpa, top, (top // 2) * gpus, 900)
    assert shed[0] == (down_at, top - scaling.scale_down_pods_per_minute)
    assert [t for t, _ in shed] == [down_at + 60 * i for i in range(len(shed))]
    assert shed[-1][1] == top // 2


def test_from_manifest_defaults_what_the_manifest_leaves_out(rendered: dict[str, Any]) -> None:
    hpa = copy.deepcopy(rendered)
    hpa["spec"]["behavior"] = {
        "scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}
    }
    del hpa["spec"]["minReplicas"]
    parsed = HpaSpec.from_manifest(hpa, downscale_stabilization_s=120)
    assert parsed.min_replicas == 1
    assert (parsed.scale_up_stabilization_s, parsed.scale_down_stabilization_s) == (0, 120)
    assert parsed.scale_up_policies == DEFAULT_SCALE_UP_POLICIES
    assert parsed.scale_down_policies == (pods(1, 60),)
    hpa["spec"]["behavior"] = {}
    parsed = HpaSpec.from_manifest(hpa)
    assert parsed.scale_down_stabilization_s == 300
    assert parsed.scale_down_policies == DEFAULT_SCALE_DOWN_POLICIES
    hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] = "500m"
    assert HpaSpec.from_manifest(hpa).target_average_value == 0.5


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return edit


_DELETE = object()
METRIC = "spec.metrics.0.external"

BAD_MANIFESTS = [
    ("apiVersion", _set("apiVersion", "autoscaling/v1")),
    ("spec.maxReplicas", _set("spec.maxReplicas", _DELETE)),
    ("spec.maxReplicas", _set("spec.maxReplicas", "8")),
    ("spec.metrics", _set("spec.metrics", [])),
    ("spec.metrics[0].type", _set("spec.metrics.0.type", "Object")),
    ("spec.metrics[0].pods", _set("spec.metrics.0.type", "Pods")),
    ("spec.metrics[0].external.target.type", _set(f"{METRIC}.target.type", "Value")),
    ("spec.metrics[0].external.target.averageValue", _set(f"{METRIC}.target.averageValue", "two")),
    ("spec.metrics[0].external.target.averageValue", _set(f"{METRIC}.target.averageValue", "0")),
    ("spec.behavior", _set("spec.behavior", _DELETE)),
    ("spec.behavior.scaleUp.tolerance", _set("spec.behavior.scaleUp.tolerance", "-1")),
    ("spec.behavior.scaleDown.tolerance", _set("spec.behavior.scaleDown.tolerance", "lots")),
    ("spec.behavior.scaleDown.selectPolicy", _set("spec.behavior.scaleDown.selectPolicy", "Any")),
    ("spec.behavior.scaleDown.policies", _set("spec.behavior.scaleDown.policies", [])),
    (
        "spec.behavior.scaleUp.policies[0].type",
        _set("spec.behavior.scaleUp.policies.0.type", "Nodes"),
    ),
    (
        "spec.behavior.scaleUp.policies[0].periodSeconds",
        _set("spec.behavior.scaleUp.policies.0.periodSeconds", 3600),
    ),
    ("spec.behavior.scaleUp.policies[0].value", _set("spec.behavior.scaleUp.policies.0.value", 0)),
    ("spec.behavior.scaleUp.extra", _set("spec.behavior.scaleUp.extra", 1)),
    ("spec: max_replicas", _set("spec.maxReplicas", 0)),
]


@pytest.mark.parametrize(("field", "edit"), BAD_MANIFESTS, ids=[f for f, _ in BAD_MANIFESTS])
def test_from_manifest_names_the_field_it_cannot_model(
    rendered: dict[str, Any], field: str, edit: Callable[[dict[str, Any]], None]
) -> None:
    hpa = copy.deepcopy(rendered)
    edit(hpa)
    with pytest.raises(ValueError, match="^" + re.escape(field)):
        HpaSpec.from_manifest(hpa)


# --- the controller's memory and bug-compatible details ----------------------------------


def test_missing_metric_records_nothing() -> None:
    state = HpaState()
    for t in (0.0, 15.0, 30.0):
        assert reconcile(spec(), state, now_s=t, current_replicas=4, metric=None) == 4
    assert state == HpaState(recommendations=[Recommendation(4, 0.0)])


def test_the_raw_recommendation_is_recorded_before_the_bounds() -> None:
    state = HpaState()
    assert reconcile(spec(max_replicas=8), state, now_s=0, current_replicas=8, metric=20.0) == 8
    assert state.recommendations == [Recommendation(8, 0.0), Recommendation(20, 0.0)]


def test_status_replicas_are_the_tolerance_answer() -> None:
    # Within the tolerance GetExternalPerPodMetricReplicas answers status.replicas, so a
    # Deployment with a pod missing is shrunk to the pods it has (3.3 / 3 is 1.1).
    hpa = NO_DOWN_WINDOW
    assert (
        reconcile(hpa, HpaState(), now_s=0, current_replicas=4, metric=3.3, status_replicas=3) == 3
    )
    assert reconcile(hpa, HpaState(), now_s=0, current_replicas=4, metric=3.3) == 4


def test_scale_events_reuse_outdated_slots() -> None:
    hpa = spec(scale_down_stabilization_s=0, scale_down_policies=(pods(1, 60),))
    state = HpaState()
    current = 10
    for t in range(0, 300, SYNC_PERIOD_S):
        current = reconcile(hpa, state, now_s=t, current_replicas=current, metric=5.0)
    assert current == 5
    assert state.scale_up_events == []
    # Events at 0, 60, 120, 180 and 240 s: each new one takes the slot of the one that left
    # the 60 s period (180 s is not yet before 240 - 60), so two slots suffice.
    assert state.scale_down_events == [ScaleEvent(1, 240.0), ScaleEvent(1, 180.0)]
    assert state.last_scale_s == 240.0


def test_a_rise_counts_against_the_scale_down_period() -> None:
    # periodStartReplicas adds back pods removed in the period and takes off pods added.
    hpa = spec(scale_down_stabilization_s=0, scale_down_policies=(pods(2, 60),))
    state = HpaState()
    assert reconcile(hpa, state, now_s=0, current_replicas=5, metric=7.0) == 7
    # 7 now, 2 added inside the period: the period started at 5, so the limit is 5 - 2 = 3.
    assert reconcile(hpa, state, now_s=15, current_replicas=7, metric=1.0) == 3


def test_adapter_and_target_milli_values() -> None:
    # prometheus-adapter truncates the sample to milli-units; the target rounds up.
    assert external_metric_milli(2.9999) == 2999
    assert external_metric_milli(0.0015) == 1
    assert spec(target_average_value=0.0015).target_milli == 2
    assert spec(target_average_value=2.0).target_milli == 2000
    with pytest.raises(ValueError, match="metric"):
        external_metric_milli(float("nan"))


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("2", "2"),
        ("500m", "0.5"),
        ("1.5k", "1500"),
        ("1Ki", "1024"),
        ("1e3", "1000"),
        (".5", "0.5"),
        (3, "3"),
    ],
)
def test_parse_quantity(text: str | int, amount: str) -> None:
    assert parse_quantity(text) == Decimal(amount)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 5, "max_replicas": 4}, "max_replicas"),
        ({"target_average_value": 0.0}, "target_average_value"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"scale_up_stabilization_s": 3601}, "scale_up_stabilization_s"),
        ({"scale_down_policies": ()}, "scale_down_policies"),
    ],
)
def test_spec_validation(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        spec(**fields)
    with pytest.raises(ValueError, match=r"^period_s\b"):
        pods(1, 0)


# replica_calculator_test.go, Pods ("qps") metrics: (current, levels, target, expected).
PODS_CASES = [
    ("TestReplicaCalcScaleUpCM", 3, [20.0, 10.0, 30.0], 15.0, 4),
    ("TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale", 3, [50.0, 10.0, 30.0], 15.0, 6),
    ("TestReplicaCalcScaleDownCM", 5, [12.0] * 5, 20.0, 3),
    ("TestReplicaCalcToleranceCM", 3, [20.0, 21.0, 21.0], 20.666, 3),
]


@pytest.mark.parametrize(
    ("current", "levels", "target", "expected"),
    [case[1:] for case in PODS_CASES],
    ids=[case[0] for case in PODS_CASES],
)
def test_pods_metric_replicas_match_the_controllers_cases(
    current: int, levels: list[float], target: float, expected: int
) -> None:
    hpa = spec(
        target_average_value=target,
        metric_type="Pods",
        max_replicas=20,
        min_replicas=1,
        scale_down_stabilization_s=0,
    )
    state = HpaState()
    got = reconcile(hpa, state, now_s=0.0, current_replicas=current, metric=None, pods=levels)
    assert got == expected


def test_pending_pods_count_as_idle_on_a_scale_up() -> None:
    """Two pods at twice the target and two Pending: the recount with the Pending pods at 0
    lands on the target, so the controller waits for them instead of adding more."""
    hpa = spec(target_average_value=0.6, metric_type="Pods", max_replicas=20, min_replicas=1)
    pods = [1.2, 1.2, None, None]
    assert reconcile(hpa, HpaState(), now_s=0.0, current_replicas=4, metric=None, pods=pods) == 4
    # Without them the same two pods ask for four.
    assert (
        reconcile(hpa, HpaState(), now_s=0.0, current_replicas=2, metric=None, pods=[1.2, 1.2]) == 4
    )
    # Hotter pods outgrow the recount: ceil(0.9 / 0.6 * 4) = 6.
    hot = [1.8, 1.8, None, None]
    assert reconcile(hpa, HpaState(), now_s=0.0, current_replicas=4, metric=None, pods=hot) == 6


def test_a_pods_hpa_without_reporting_pods_does_not_scale() -> None:
    hpa = spec(target_average_value=0.6, metric_type="Pods", max_replicas=20, min_replicas=1)
    state = HpaState()
    assert reconcile(hpa, state, now_s=0.0, current_replicas=3, metric=None, pods=[None]) == 3
    assert state.scale_up_events == [] and state.scale_down_events == []


def test_from_manifest_reads_a_rendered_production_hpa(policy: PoolPolicy) -> None:
    workload = next(w for w in policy.production if w.renders_hpa)
    parsed = HpaSpec.from_manifest(production_autoscaler(policy, workload))
    assert parsed.metric_type == "Pods"
    assert parsed.target_average_value == workload.target_gpu_utilization
    assert (parsed.min_replicas, parsed.max_replicas) == (
        workload.min_replicas,
        workload.max_replicas,
    )
    assert parsed.scale_down_stabilization_s == workload.scale_down_stabilization_s
