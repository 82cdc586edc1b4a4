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

What the sync reads from the HPA object (``HpaSpec``: its bounds, target, tolerances and
defaulted ``behavior``) and the parser of a rendered manifest are ``runtime.sim.hpa_spec``.

The simulator calls ``reconcile`` every ``SYNC_PERIOD_S`` simulated seconds per HPA, with one
``HpaState`` per HPA (the controller's in-memory maps for that key), and then sets the
Deployment's ``spec.replicas`` to the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from runtime.sim.hpa_spec import PODS_METRIC, HpaSpec, ScalingPolicy, SelectPolicy

SYNC_PERIOD_S: Final = 15
"""``--horizontal-pod-autoscaler-sync-period`` default: how often the controller syncs an HPA."""

MAX_INT32: Final = 2**31 - 1
MIN_INT32: Final = -(2**31)

PodSample = float | None
"""One pod of a Pods-metric HPA's target: its metric value, or ``None`` for a Pending pod
(``groupPods``' unready pods). Deleted and Failed pods (ignored upstream) are left out."""


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
        proposal = _metric_replicas(spec, current_replicas, status, usage_milli, pods)
        if proposal is None:
            return current_replicas  # FailedComputeMetricsReplicas: no scale, nothing recorded
        desired = normalize_desired_replicas_with_behaviors(
            spec,
            state,
            now_s=now_s,
            current_replicas=current_replicas,
            desired_replicas=max(0, proposal),
        )
    if desired == current_replicas:
        return current_replicas
    store_scale_event(
        spec, state, now_s=now_s, prev_replicas=current_replicas, new_replicas=desired
    )
    state.last_scale_s = now_s
    return desired


def _metric_replicas(
    spec: HpaSpec,
    current_replicas: int,
    status_replicas: int,
    usage_milli: int | None,
    pods: Sequence[PodSample] | None,
) -> int | None:
    """``computeReplicasForMetrics`` for the HPA's one metric with its direction's tolerance:
    the proposal, or None where the metric is missing (the sync fails)."""
    down = _or(spec.scale_down_tolerance, spec.tolerance)
    up = _or(spec.scale_up_tolerance, spec.tolerance)
    if spec.metric_type == PODS_METRIC:
        return pods_metric_replicas(
            current_replicas,
            spec.target_milli,
            [None if v is None else external_metric_milli(v) for v in pods or ()],
            down=down,
            up=up,
        )
    if usage_milli is None:
        return None
    return get_external_per_pod_metric_replicas(
        status_replicas, spec.target_milli, usage_milli, down=down, up=up
    )


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


def _int32(value: float) -> int:
    """Go's ``int32(float64)`` for in-range values: truncation toward zero."""
    return int(value)


def _longest_policy_period(policies: Sequence[ScalingPolicy]) -> int:
    """``getLongestPolicyPeriod``."""
    return max((p.period_s for p in policies), default=0)
