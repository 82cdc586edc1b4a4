"""The Kubernetes HPA controller's replica decision, ported for gpupool's flex HPA.

A pure-Python port of what ``kube-controller-manager`` does on one sync of one
``autoscaling/v2`` HorizontalPodAutoscaler with ``behavior`` set, for the one metric shape
gpupool renders: the flex HPA's single External metric (``infra.builders.workload.autoscaler``:
``gpupool_flex_gpu_budget``, ``AverageValue`` target ``gpus_per_replica``) and a production
HPA's single Pods metric (``infra.builders.production.autoscaler``: the pods' mean GPU duty
cycle, ``AverageValue`` target ``target_gpu_utilization``). The
upstream sources are ``pkg/controller/podautoscaler/horizontal.go`` and
``replica_calculator.go``; every function here names the Go function it ports, and keeps
its arithmetic (milli-value integers, float64 ratios, truncating or rounding-up int32
conversions) and its time comparisons (strict ``After``/``Before``) so a simulated sync gives
the number the real controller would.

One sync (``reconcile``, after ``reconcileAutoscaler``):

1. ``recordInitialRecommendation`` seeds the recommendation history with the current
   replica count the first time the HPA is seen: a fresh controller does not scale down
   until the scale-down window has passed.
2. ``spec.replicas == 0`` with ``minReplicas > 0`` disables scaling; replicas outside
   ``[minReplicas, maxReplicas]`` go straight to the bound (no metric, no stabilization).
3. Otherwise ``GetExternalPerPodMetricReplicas``: ``usageRatio = usage / (target *
   status.replicas)``; inside the tolerance the answer is ``status.replicas``, else
   ``ceil(usage / target)``. A missing metric fails the sync: nothing changes. For a Pods
   metric, ``calcPlainMetricReplicas`` on the pods' values (``pods_metric_replicas``).
4. ``stabilizeRecommendationWithBehaviors``: the current replicas are pulled up to the lowest
   recommendation of the scale-up window and down to the highest of the scale-down window
   (both include this sync's); the raw recommendation is recorded.
5. ``convertDesiredReplicasWithBehaviorRate``: the scale-up / scale-down limits of the
   policies, from the scale events of each policy's period, then ``maxReplicas`` /
   ``minReplicas``.
6. A changed count is a scale event (``storeScaleEvent``).

The simulator calls ``reconcile`` every ``SYNC_PERIOD_S`` simulated seconds per HPA, with one
``HpaState`` per HPA (the controller's in-memory maps for that key), and then sets the
Deployment's ``spec.replicas`` to the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final, Literal, cast

from policy.quantity import parse_quantity

PolicyKind = Literal["Pods", "Percent"]
"""``HPAScalingPolicyType``."""

SelectPolicy = Literal["Max", "Min", "Disabled"]
"""``ScalingPolicySelect``."""

SYNC_PERIOD_S: Final = 15
"""``--horizontal-pod-autoscaler-sync-period`` default: how often the controller syncs an HPA."""

DEFAULT_TOLERANCE: Final = 0.1
"""``--horizontal-pod-autoscaler-tolerance`` default."""

DEFAULT_DOWNSCALE_STABILIZATION_S: Final = 300
"""``--horizontal-pod-autoscaler-downscale-stabilization`` default (5 min): the scale-down
window of a ``behavior.scaleDown`` that does not set one
(``maybeInitScaleDownStabilizationWindow``)."""

MAX_STABILIZATION_WINDOW_S: Final = 3600
"""API validation: ``stabilizationWindowSeconds`` is 0-3600."""

MAX_PERIOD_S: Final = 1800
"""API validation: a policy's ``periodSeconds`` is 1-1800."""

MAX_INT32: Final = 2**31 - 1
MIN_INT32: Final = -(2**31)

EXTERNAL_METRIC: Final = "External"
PODS_METRIC: Final = "Pods"
AVERAGE_VALUE: Final = "AverageValue"

MetricType = Literal["External", "Pods"]
"""The metric shapes the port models (see the module docstring)."""

PodSample = float | None
"""One pod of a Pods-metric HPA's target: its metric value, or ``None`` for a Pending pod
(``groupPods``' unready pods). Deleted and Failed pods (ignored upstream) are left out."""


@dataclass(frozen=True)
class ScalingPolicy:
    """One ``HPAScalingPolicy``: at most ``value`` pods (or percent) of change per ``period_s``."""

    kind: PolicyKind
    value: int
    period_s: int

    def __post_init__(self) -> None:
        if self.kind not in ("Pods", "Percent"):
            raise ValueError(f"kind: must be Pods or Percent, got {self.kind!r}")
        if self.value <= 0:
            raise ValueError(f"value: must be greater than zero, got {self.value}")
        if not 0 < self.period_s <= MAX_PERIOD_S:
            raise ValueError(f"period_s: must be 1-{MAX_PERIOD_S}, got {self.period_s}")


DEFAULT_SCALE_UP_POLICIES: Final = (
    ScalingPolicy("Pods", 4, 15),
    ScalingPolicy("Percent", 100, 15),
)
"""``defaultHPAScaleUpRules`` (``pkg/apis/autoscaling/v2/defaults.go``): 4 pods or 100 % per
15 s, whichever allows more."""

DEFAULT_SCALE_DOWN_POLICIES: Final = (ScalingPolicy("Percent", 100, 15),)
"""``defaultHPAScaleDownRules``: 100 % per 15 s (down to ``minReplicas`` in one step)."""

DEFAULT_SCALE_UP_STABILIZATION_S: Final = 0
"""``defaultHPAScaleUpRules.StabilizationWindowSeconds``."""


@dataclass(frozen=True)
class HpaSpec:
    """What one sync reads from an ``autoscaling/v2`` HPA (``behavior`` already defaulted).

    ``target_average_value`` is the External metric's ``AverageValue`` target (the controller
    uses its milli-value, rounded up like ``Quantity.MilliValue``). ``tolerance`` is the
    controller flag; ``scale_up_tolerance`` / ``scale_down_tolerance`` are the HPA's own
    ``behavior.*.tolerance`` (``HPAConfigurableTolerance``), which replace it for their
    direction when set. ``scale_down_stabilization_s`` is the
    resolved window: a manifest without one gets the controller flag, see ``from_manifest``.
    """

    min_replicas: int
    max_replicas: int
    target_average_value: float
    metric_type: MetricType = EXTERNAL_METRIC
    tolerance: float = DEFAULT_TOLERANCE
    scale_up_tolerance: float | None = None
    scale_down_tolerance: float | None = None
    scale_up_stabilization_s: int = DEFAULT_SCALE_UP_STABILIZATION_S
    scale_down_stabilization_s: int = DEFAULT_DOWNSCALE_STABILIZATION_S
    scale_up_policies: tuple[ScalingPolicy, ...] = DEFAULT_SCALE_UP_POLICIES
    scale_down_policies: tuple[ScalingPolicy, ...] = DEFAULT_SCALE_DOWN_POLICIES
    scale_up_select: SelectPolicy = "Max"
    scale_down_select: SelectPolicy = "Max"

    def __post_init__(self) -> None:
        # minReplicas 0 needs the HPAScaleToZero gate upstream; the controller handles it.
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas: must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"max_replicas: must be >= 1 and >= min_replicas ({self.min_replicas}), "
                f"got {self.max_replicas}"
            )
        if self.metric_type not in (EXTERNAL_METRIC, PODS_METRIC):
            raise ValueError(f"metric_type: must be External or Pods, got {self.metric_type!r}")
        if not (math.isfinite(self.target_average_value) and self.target_average_value > 0):
            raise ValueError(
                f"target_average_value: must be a positive number, got {self.target_average_value}"
            )
        for name in ("tolerance", "scale_up_tolerance", "scale_down_tolerance"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be >= 0, got {value}")
        for name in ("scale_up_stabilization_s", "scale_down_stabilization_s"):
            window = getattr(self, name)
            if not 0 <= window <= MAX_STABILIZATION_WINDOW_S:
                raise ValueError(f"{name}: must be 0-{MAX_STABILIZATION_WINDOW_S}, got {window}")
        for name in ("scale_up_policies", "scale_down_policies"):
            if not getattr(self, name):
                raise ValueError(f"{name}: at least one policy is required")
        for name in ("scale_up_select", "scale_down_select"):
            if getattr(self, name) not in ("Max", "Min", "Disabled"):
                raise ValueError(
                    f"{name}: must be Max, Min or Disabled, got {getattr(self, name)!r}"
                )

    @property
    def target_milli(self) -> int:
        """``Target.AverageValue.MilliValue()``: the target in milli-units, rounded up."""
        return _milli_ceil(Decimal(repr(self.target_average_value)))

    @classmethod
    def from_manifest(
        cls,
        hpa: Mapping[str, Any],
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        downscale_stabilization_s: int = DEFAULT_DOWNSCALE_STABILIZATION_S,
    ) -> HpaSpec:
        """Parse an ``autoscaling/v2`` HPA as gpupool renders it, with the API's defaults.

        Supported: one ``External`` or ``Pods`` metric with an ``AverageValue`` target, and a
        ``behavior``
        whose missing parts take the API server's defaults (``SetDefaults_HorizontalPodAutoscaler``,
        ``GenerateHPAScaleUpRules`` / ``GenerateHPAScaleDownRules``: ``minReplicas`` 1, the
        default policies, ``selectPolicy: Max``, scale-up window 0). A scale-down rule without
        ``stabilizationWindowSeconds`` gets ``downscale_stabilization_s``, the controller flag
        (``maybeInitScaleDownStabilizationWindow``). ``tolerance`` is the controller flag.
        Anything else raises ``ValueError`` naming the field: other metric types or targets,
        several metrics, no ``behavior`` (the controller then runs its legacy
        ``normalizeDesiredReplicas`` path, not ported), unknown keys. A rule's ``tolerance``
        (``HPAConfigurableTolerance``) is read as the controller does with the gate on.
        """
        if hpa.get("apiVersion") != "autoscaling/v2":
            raise ValueError(f"apiVersion: expected autoscaling/v2, got {hpa.get('apiVersion')!r}")
        if hpa.get("kind") != "HorizontalPodAutoscaler":
            raise ValueError(f"kind: expected HorizontalPodAutoscaler, got {hpa.get('kind')!r}")
        spec = _mapping(hpa.get("spec"), "spec")
        min_replicas = _int(spec.get("minReplicas", 1), "spec.minReplicas")
        if "maxReplicas" not in spec:
            raise ValueError("spec.maxReplicas: required")
        max_replicas = _int(spec["maxReplicas"], "spec.maxReplicas")
        metric_type, target = _average_value(spec.get("metrics"))
        if "behavior" not in spec:
            raise ValueError(
                "spec.behavior: required (an HPA without behavior takes the controller's legacy "
                "normalizeDesiredReplicas path, which this port does not model)"
            )
        behavior = _mapping(spec["behavior"], "spec.behavior")
        _known_keys(behavior, {"scaleUp", "scaleDown"}, "spec.behavior")
        up_window, up_select, up_policies, up_tolerance = _rules(
            behavior.get("scaleUp"),
            "spec.behavior.scaleUp",
            default_window=DEFAULT_SCALE_UP_STABILIZATION_S,
            default_policies=DEFAULT_SCALE_UP_POLICIES,
        )
        down_window, down_select, down_policies, down_tolerance = _rules(
            behavior.get("scaleDown"),
            "spec.behavior.scaleDown",
            default_window=downscale_stabilization_s,
            default_policies=DEFAULT_SCALE_DOWN_POLICIES,
        )
        try:
            return cls(
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                target_average_value=float(target),
                metric_type=metric_type,
                tolerance=tolerance,
                scale_up_tolerance=up_tolerance,
                scale_down_tolerance=down_tolerance,
                scale_up_stabilization_s=up_window,
                scale_down_stabilization_s=down_window,
                scale_up_policies=up_policies,
                scale_down_policies=down_policies,
                scale_up_select=up_select,
                scale_down_select=down_select,
            )
        except ValueError as err:
            raise ValueError(f"spec: {err}") from err


@dataclass
class Recommendation:
    """``timestampedRecommendation``: an unstabilized recommendation and when it was made."""

    replicas: int
    at_s: float


@dataclass
class ScaleEvent:
    """``timestampedScaleEvent``: a change the controller made to ``spec.replicas``.

    ``change`` is positive in both lists (pods added in ``scale_up_events``, pods removed in
    ``scale_down_events``), as upstream stores it despite its field comment. ``outdated``
    marks an event older than the direction's longest policy period, whose slot the next
    event of that direction reuses (``markScaleEventsOutdated``).
    """

    change: int
    at_s: float
    outdated: bool = False


@dataclass
class HpaState:
    """The controller's memory for one HPA key: ``recommendations``, ``scaleUpEvents`` and
    ``scaleDownEvents`` of ``HorizontalController``, plus ``status.lastScaleTime``.

    Start each simulated HPA with a fresh ``HpaState()``, like a controller that has just
    started (or first seen the HPA); it is updated in place by ``reconcile``.
    """

    recommendations: list[Recommendation] = field(default_factory=list)
    scale_up_events: list[ScaleEvent] = field(default_factory=list)
    scale_down_events: list[ScaleEvent] = field(default_factory=list)
    last_scale_s: float | None = None


def reconcile(
    spec: HpaSpec,
    state: HpaState,
    *,
    now_s: float,
    current_replicas: int,
    metric: float | None,
    status_replicas: int | None = None,
    pods: Sequence[PodSample] | None = None,
) -> int:
    """One HPA sync: the new desired replica count (== current when holding).

    Port of ``reconcileAutoscaler`` for an HPA with ``behavior``. ``current_replicas`` is the
    target's ``spec.replicas`` (``scale.Spec.Replicas``); ``status_replicas`` its
    ``status.replicas`` (``scale.Status.Replicas``, the pods that exist), which upstream uses in
    the AverageValue ratio; it defaults to ``current_replicas``. ``metric`` is the External
    metric's value as Prometheus evaluates the recording rule (the budget, in GPUs); it
    reaches the controller through prometheus-adapter as a milli-value
    (``external_metric_milli``). ``None`` means the adapter returns no series: the
    controller's metric computation fails and it does not scale (it still moves replicas
    that are outside ``[min_replicas, max_replicas]`` to the bound, which needs no metric).
    A Pods-metric HPA reads ``pods`` instead (one ``PodSample`` per pod of the target);
    no pod with a value fails the sync the same way.
    """
    if current_replicas < 0:
        raise ValueError(f"current_replicas: must be >= 0, got {current_replicas}")
    status = current_replicas if status_replicas is None else status_replicas
    if status < 0:
        raise ValueError(f"status_replicas: must be >= 0, got {status}")
    usage_milli = None if metric is None else external_metric_milli(metric)

    record_initial_recommendation(state, current_replicas, now_s)
    if current_replicas == 0 and spec.min_replicas != 0:
        return current_replicas  # "ScalingDisabled": the target was scaled to zero by hand
    if current_replicas > spec.max_replicas:
        desired = spec.max_replicas
    elif current_replicas < spec.min_replicas:
        desired = spec.min_replicas
    else:
        down = _or(spec.scale_down_tolerance, spec.tolerance)
        up = _or(spec.scale_up_tolerance, spec.tolerance)
        if spec.metric_type == PODS_METRIC:
            proposal = pods_metric_replicas(
                current_replicas,
                spec.target_milli,
                [None if v is None else external_metric_milli(v) for v in pods or ()],
                down=down,
                up=up,
            )
        elif usage_milli is None:
            proposal = None
        else:
            proposal = get_external_per_pod_metric_replicas(
                status, spec.target_milli, usage_milli, down=down, up=up
            )
        if proposal is None:
            return current_replicas  # FailedComputeMetricsReplicas: no scale, nothing recorded
        desired = max(0, proposal)
        desired = normalize_desired_replicas_with_behaviors(
            spec, state, now_s=now_s, current_replicas=current_replicas, desired_replicas=desired
        )
    if desired == current_replicas:
        return current_replicas
    store_scale_event(
        spec, state, now_s=now_s, prev_replicas=current_replicas, new_replicas=desired
    )
    state.last_scale_s = now_s
    return desired


def external_metric_milli(value: float) -> int:
    """The metric as the controller receives it, in milli-units.

    prometheus-adapter serves a sample as ``resource.NewMilliQuantity(int64(sample.Value *
    1000.0), ...)`` (``metricConverter.convertSample``): float64 product, truncated toward
    zero; the controller's metrics client then reads ``MilliValue()`` of it, which is exact.
    Non-finite values raise ``ValueError`` (Go's conversion of them is not defined).
    """
    if not math.isfinite(value):
        raise ValueError(f"metric: must be finite, got {value}")
    return int(value * 1000.0)


def record_initial_recommendation(state: HpaState, current_replicas: int, now_s: float) -> None:
    """``recordInitialRecommendation``: the first sync seeds the history with the current count.

    The seed sits in the scale-down window like any recommendation, so a controller that
    just started holds the current count for a full scale-down window before shrinking.
    """
    if not state.recommendations:
        state.recommendations.append(Recommendation(current_replicas, now_s))


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def is_within_tolerance(usage_ratio: float, *, down: float, up: float) -> bool:
    """``Tolerances.isWithin``: ``1 - down <= ratio <= 1 + up``."""
    return (1.0 - down) <= usage_ratio <= (1.0 + up)


def get_external_per_pod_metric_replicas(
    status_replicas: int, target_milli: int, usage_milli: int, *, down: float, up: float
) -> int:
    """``ReplicaCalculator.GetExternalPerPodMetricReplicas`` for one returned series.

    ``usageRatio = usage / (target * status.replicas)`` in float64; within the tolerance the
    proposal is ``status.replicas`` (not ``spec.replicas``), otherwise ``ceil(usage / target)``
    capped at MaxInt32. With no pods Go's division gives +Inf or NaN, neither within the
    tolerance, so the proposal is recomputed from the metric alone.
    """
    if status_replicas > 0:
        usage_ratio = float(usage_milli) / (float(target_milli) * float(status_replicas))
        if is_within_tolerance(usage_ratio, down=down, up=up):
            return status_replicas
    proposal = math.ceil(float(usage_milli) / float(target_milli))
    return min(proposal, MAX_INT32)


def pods_metric_replicas(
    current_replicas: int, target_milli: int, pods: Sequence[int | None], *, down: float, up: float
) -> int | None:
    """``ReplicaCalculator.calcPlainMetricReplicas`` (``GetMetricReplicas``) for a Pods metric.

    ``pods`` holds each pod's value in milli-units (``None``: Pending, ``groupPods``' unready;
    every other pod reports, so nothing is missing). The ratio is the ready pods' mean (Go's
    integer average) over the target. Inside the tolerance, or with unready pods on a
    scale-up whose recount (unready pods at 0) falls inside it or flips direction, the answer
    is ``current_replicas``; else ``ceil(ratio * pods counted)``. ``None``: no pod has a value
    (the controller's "did not receive metrics"), so the sync fails.
    """
    ready = [v for v in pods if v is not None]
    if not ready:
        return None
    unready = len(pods) - len(ready)
    ratio = float(sum(ready) // len(ready)) / float(target_milli)
    if not (unready > 0 and ratio > 1.0):
        if is_within_tolerance(ratio, down=down, up=up):
            return current_replicas
        return min(math.ceil(ratio * len(ready)), MAX_INT32)
    counted = len(pods)
    new_ratio = float(sum(ready) // counted) / float(target_milli)
    if is_within_tolerance(new_ratio, down=down, up=up) or new_ratio < 1.0:
        return current_replicas
    replicas = min(math.ceil(new_ratio * counted), MAX_INT32)
    return current_replicas if replicas < current_replicas else replicas


def normalize_desired_replicas_with_behaviors(
    spec: HpaSpec,
    state: HpaState,
    *,
    now_s: float,
    current_replicas: int,
    desired_replicas: int,
) -> int:
    """``normalizeDesiredReplicasWithBehaviors``: stabilize, then apply the rate and bounds."""
    stabilized = stabilize_recommendation_with_behaviors(
        spec,
        state,
        now_s=now_s,
        current_replicas=current_replicas,
        desired_replicas=desired_replicas,
    )
    return convert_desired_replicas_with_behavior_rate(
        spec, state, now_s=now_s, current_replicas=current_replicas, desired_replicas=stabilized
    )


def stabilize_recommendation_with_behaviors(
    spec: HpaSpec,
    state: HpaState,
    *,
    now_s: float,
    current_replicas: int,
    desired_replicas: int,
) -> int:
    """``stabilizeRecommendationWithBehaviors``.

    ``up`` is the lowest of this recommendation and those made after ``now - scaleUp
    window``; ``down`` the highest of this one and those after ``now - scaleDown window``
    (strictly after, as ``time.After``). The result is the current count raised to ``up``,
    then lowered to ``down``. The raw ``desired_replicas`` (before any clamping to the
    replica bounds) is recorded, reusing the slot of the last recommendation older than
    both windows, else appended.
    """
    up_cutoff = now_s - spec.scale_up_stabilization_s
    down_cutoff = now_s - spec.scale_down_stabilization_s
    up_recommendation = desired_replicas
    down_recommendation = desired_replicas
    old_index: int | None = None
    for i, rec in enumerate(state.recommendations):
        if rec.at_s > up_cutoff:
            up_recommendation = min(rec.replicas, up_recommendation)
        if rec.at_s > down_cutoff:
            down_recommendation = max(rec.replicas, down_recommendation)
        if rec.at_s < up_cutoff and rec.at_s < down_cutoff:
            old_index = i

    recommendation = current_replicas
    if recommendation < up_recommendation:
        recommendation = up_recommendation
    if recommendation > down_recommendation:
        recommendation = down_recommendation

    recorded = Recommendation(desired_replicas, now_s)
    if old_index is not None:
        state.recommendations[old_index] = recorded
    else:
        state.recommendations.append(recorded)
    return recommendation


def convert_desired_replicas_with_behavior_rate(
    spec: HpaSpec,
    state: HpaState,
    *,
    now_s: float,
    current_replicas: int,
    desired_replicas: int,
) -> int:
    """``convertDesiredReplicasWithBehaviorRate``: the policies' rate limit, then the bounds.

    Scaling up is capped at the lower of ``maxReplicas`` and the scale-up limit (never below
    the current count); scaling down at the higher of ``minReplicas`` and the scale-down
    limit (never above the current count).
    """
    if desired_replicas > current_replicas:
        up_limit = calculate_scale_up_limit_with_scaling_rules(
            current_replicas,
            state.scale_up_events,
            state.scale_down_events,
            spec.scale_up_policies,
            spec.scale_up_select,
            now_s=now_s,
        )
        up_limit = max(up_limit, current_replicas)
        maximum_allowed = min(spec.max_replicas, up_limit)
        return min(desired_replicas, maximum_allowed)
    if desired_replicas < current_replicas:
        down_limit = calculate_scale_down_limit_with_behaviors(
            current_replicas,
            state.scale_up_events,
            state.scale_down_events,
            spec.scale_down_policies,
            spec.scale_down_select,
            now_s=now_s,
        )
        down_limit = min(down_limit, current_replicas)
        minimum_allowed = max(spec.min_replicas, down_limit)
        return max(desired_replicas, minimum_allowed)
    return desired_replicas


def get_replicas_change_per_period(
    period_s: int, events: Sequence[ScaleEvent], *, now_s: float
) -> int:
    """``getReplicasChangePerPeriod``: the changes made strictly after ``now - period``."""
    cutoff = now_s - period_s
    return sum(event.change for event in events if event.at_s > cutoff)


def calculate_scale_up_limit_with_scaling_rules(
    current_replicas: int,
    scale_up_events: Sequence[ScaleEvent],
    scale_down_events: Sequence[ScaleEvent],
    policies: Sequence[ScalingPolicy],
    select: SelectPolicy,
    *,
    now_s: float,
) -> int:
    """``calculateScaleUpLimitWithScalingRules``: the most replicas the policies allow now.

    Each policy starts from the count at the start of its period (current, minus pods added,
    plus pods removed within it): ``Pods`` adds ``value``, ``Percent`` multiplies by ``1 +
    value/100`` and rounds up. ``Max`` takes the highest result, ``Min`` the lowest,
    ``Disabled`` allows no change.
    """
    if select == "Disabled":
        return current_replicas
    pick = min if select == "Min" else max
    result = MAX_INT32 if select == "Min" else MIN_INT32
    for policy in policies:
        added = get_replicas_change_per_period(policy.period_s, scale_up_events, now_s=now_s)
        deleted = get_replicas_change_per_period(policy.period_s, scale_down_events, now_s=now_s)
        period_start = current_replicas - added + deleted
        if policy.kind == "Pods":
            proposed = period_start + policy.value
        else:
            proposed = _int32(math.ceil(float(period_start) * (1 + float(policy.value) / 100)))
        result = pick(result, proposed)
    return result


def calculate_scale_down_limit_with_behaviors(
    current_replicas: int,
    scale_up_events: Sequence[ScaleEvent],
    scale_down_events: Sequence[ScaleEvent],
    policies: Sequence[ScalingPolicy],
    select: SelectPolicy,
    *,
    now_s: float,
) -> int:
    """``calculateScaleDownLimitWithBehaviors``: the fewest replicas the policies allow now.

    ``Pods`` subtracts ``value`` from the period's starting count; ``Percent`` multiplies it
    by ``1 - value/100`` and truncates (so the pods removed round up). ``Max`` (most change)
    takes the lowest result, ``Min`` the highest, ``Disabled`` allows no change.
    """
    if select == "Disabled":
        return current_replicas
    pick = max if select == "Min" else min
    result = MIN_INT32 if select == "Min" else MAX_INT32
    for policy in policies:
        added = get_replicas_change_per_period(policy.period_s, scale_up_events, now_s=now_s)
        deleted = get_replicas_change_per_period(policy.period_s, scale_down_events, now_s=now_s)
        period_start = current_replicas - added + deleted
        if policy.kind == "Pods":
            proposed = period_start - policy.value
        else:
            proposed = _int32(float(period_start) * (1 - float(policy.value) / 100))
        result = pick(result, proposed)
    return result


def store_scale_event(
    spec: HpaSpec, state: HpaState, *, now_s: float, prev_replicas: int, new_replicas: int
) -> None:
    """``storeScaleEvent``: record a change, reusing an outdated slot of its direction.

    Events older than the direction's longest policy period are first marked outdated
    (``markScaleEventsOutdated``, ``getLongestPolicyPeriod``); the new event replaces the last
    outdated one, else it is appended.
    """
    if new_replicas > prev_replicas:
        events = state.scale_up_events
        longest = _longest_policy_period(spec.scale_up_policies)
        change = new_replicas - prev_replicas
    else:
        events = state.scale_down_events
        longest = _longest_policy_period(spec.scale_down_policies)
        change = prev_replicas - new_replicas
    cutoff = now_s - longest
    for event in events:
        if event.at_s < cutoff:
            event.outdated = True
    old_index: int | None = None
    for i, event in enumerate(events):
        if event.outdated:
            old_index = i
    new_event = ScaleEvent(change, now_s)
    if old_index is not None:
        events[old_index] = new_event
    else:
        events.append(new_event)


def _milli_ceil(amount: Decimal) -> int:
    """``Quantity.MilliValue()``: milli-units, rounded up."""
    return int((amount * 1000).to_integral_value(rounding=ROUND_CEILING))


def _int32(value: float) -> int:
    """Go's ``int32(float64)`` for in-range values: truncation toward zero."""
    return int(value)


def _longest_policy_period(policies: Sequence[ScalingPolicy]) -> int:
    """``getLongestPolicyPeriod``."""
    return max((p.period_s for p in policies), default=0)


def _mapping(value: object, field_name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{field_name}: expected a mapping, got {type(value).__name__}")
    return cast(Mapping[str, Any], value)


def _int(value: object, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field_name}: expected an integer, got {value!r}")
    return value


def _known_keys(mapping: Mapping[str, Any], known: set[str], field_name: str) -> None:
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ValueError(f"{field_name}.{unknown[0]}: not modelled by this port")


def _average_value(metrics: object) -> tuple[MetricType, Decimal]:
    """The type and ``AverageValue`` of the single External or Pods metric; ValueError naming
    the field otherwise."""
    if not isinstance(metrics, Sequence) or isinstance(metrics, str) or len(metrics) != 1:
        count = len(metrics) if isinstance(metrics, Sequence) else 0
        raise ValueError(f"spec.metrics: exactly one metric is modelled, got {count}")
    metric = _mapping(metrics[0], "spec.metrics[0]")
    kind = metric.get("type")
    if kind not in (EXTERNAL_METRIC, PODS_METRIC):
        raise ValueError(
            f"spec.metrics[0].type: only {EXTERNAL_METRIC} and {PODS_METRIC} are modelled, "
            f"got {kind!r}"
        )
    key = "external" if kind == EXTERNAL_METRIC else "pods"
    source = _mapping(metric.get(key), f"spec.metrics[0].{key}")
    target = _mapping(source.get("target"), f"spec.metrics[0].{key}.target")
    if target.get("type") != AVERAGE_VALUE:
        raise ValueError(
            f"spec.metrics[0].{key}.target.type: only {AVERAGE_VALUE} is modelled, "
            f"got {target.get('type')!r}"
        )
    field_name = f"spec.metrics[0].{key}.target.averageValue"
    if "averageValue" not in target:
        raise ValueError(f"{field_name}: required")
    amount = parse_quantity(target["averageValue"], field_name)
    if amount <= 0:
        raise ValueError(f"{field_name}: must be positive, got {target['averageValue']!r}")
    return cast(MetricType, kind), amount


def _rules(
    value: object,
    field_name: str,
    *,
    default_window: int,
    default_policies: tuple[ScalingPolicy, ...],
) -> tuple[int, SelectPolicy, tuple[ScalingPolicy, ...], float | None]:
    """``copyHPAScalingRules`` over the defaults: (window, selectPolicy, policies, tolerance)."""
    if value is None:
        return default_window, "Max", default_policies, None
    rules = _mapping(value, field_name)
    _known_keys(
        rules, {"stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance"}, field_name
    )
    tolerance = None
    if rules.get("tolerance") is not None:
        # Quantity.AsApproximateFloat64; validation requires >= 0.
        tolerance = float(parse_quantity(rules["tolerance"], f"{field_name}.tolerance"))
        if tolerance < 0:
            raise ValueError(f"{field_name}.tolerance: must be >= 0, got {rules['tolerance']!r}")
    window = default_window
    if rules.get("stabilizationWindowSeconds") is not None:
        window = _int(
            rules["stabilizationWindowSeconds"], f"{field_name}.stabilizationWindowSeconds"
        )
    select = rules.get("selectPolicy")
    if select is None:
        select = "Max"
    if select not in ("Max", "Min", "Disabled"):
        raise ValueError(f"{field_name}.selectPolicy: must be Max, Min or Disabled, got {select!r}")
    policies = default_policies
    if rules.get("policies") is not None:
        items = rules["policies"]
        if not isinstance(items, Sequence) or isinstance(items, str) or not items:
            raise ValueError(f"{field_name}.policies: at least one policy is required")
        policies = tuple(
            _policy(item, f"{field_name}.policies[{i}]") for i, item in enumerate(items)
        )
    return window, cast(SelectPolicy, select), policies, tolerance


def _policy(value: object, field_name: str) -> ScalingPolicy:
    item = _mapping(value, field_name)
    _known_keys(item, {"type", "value", "periodSeconds"}, field_name)
    kind = item.get("type")
    if kind not in ("Pods", "Percent"):
        raise ValueError(f"{field_name}.type: must be Pods or Percent, got {kind!r}")
    amount = _int(item.get("value"), f"{field_name}.value")
    if amount <= 0:
        raise ValueError(f"{field_name}.value: must be greater than zero, got {amount}")
    period = _int(item.get("periodSeconds"), f"{field_name}.periodSeconds")
    if not 0 < period <= MAX_PERIOD_S:
        raise ValueError(f"{field_name}.periodSeconds: must be 1-{MAX_PERIOD_S}, got {period}")
    return ScalingPolicy(kind=cast(PolicyKind, kind), value=amount, period_s=period)
