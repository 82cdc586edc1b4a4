"""An ``autoscaling/v2`` HorizontalPodAutoscaler as the controller reads it, for the HPA port.

``HpaSpec`` is what one sync of ``runtime.sim.hpa.reconcile`` reads from an HPA: its replica
bounds, its single metric's ``AverageValue`` target, the tolerances and ``behavior`` with the
API server's defaults filled in. ``HpaSpec.from_manifest`` parses a rendered manifest
(``infra.builders.workload.autoscaler``, ``infra.builders.production.autoscaler``) and
refuses, naming the field, whatever the port does not model. Defaults and limits are the
upstream ones (``pkg/apis/autoscaling/v2/defaults.go``, the API validation, the
controller-manager flags), named after them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final, Literal, NamedTuple, cast

from policy.quantity import parse_quantity

PolicyKind = Literal["Pods", "Percent"]
"""``HPAScalingPolicyType``."""

SelectPolicy = Literal["Max", "Min", "Disabled"]
"""``ScalingPolicySelect``."""

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

EXTERNAL_METRIC: Final = "External"
PODS_METRIC: Final = "Pods"
AVERAGE_VALUE: Final = "AverageValue"

MetricType = Literal["External", "Pods"]
"""The metric shapes the port models (see the module docstring)."""


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
        ``behavior`` whose missing parts take the API server's defaults
        (``SetDefaults_HorizontalPodAutoscaler``, ``GenerateHPAScaleUpRules`` /
        ``GenerateHPAScaleDownRules``: ``minReplicas`` 1, the default policies,
        ``selectPolicy: Max``, scale-up window 0). A scale-down rule without
        ``stabilizationWindowSeconds`` gets ``downscale_stabilization_s``, the controller flag
        (``maybeInitScaleDownStabilizationWindow``). ``tolerance`` is the controller flag.
        Anything else raises ``ValueError`` naming the field: other metric types or targets,
        several metrics, no ``behavior`` (the controller then runs its legacy
        ``normalizeDesiredReplicas`` path, not ported), unknown keys. A rule's ``tolerance``
        (``HPAConfigurableTolerance``) is read as the controller does with the gate on.
        """
        spec = _spec(hpa)
        min_replicas = _int(spec.get("minReplicas", 1), "spec.minReplicas")
        if "maxReplicas" not in spec:
            raise ValueError("spec.maxReplicas: required")
        max_replicas = _int(spec["maxReplicas"], "spec.maxReplicas")
        metric_type, target = _average_value(spec.get("metrics"))
        up, down = _behavior(spec, downscale_stabilization_s)
        try:
            return cls(
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                target_average_value=float(target),
                metric_type=metric_type,
                tolerance=tolerance,
                scale_up_tolerance=up.tolerance,
                scale_down_tolerance=down.tolerance,
                scale_up_stabilization_s=up.window,
                scale_down_stabilization_s=down.window,
                scale_up_policies=up.policies,
                scale_down_policies=down.policies,
                scale_up_select=up.select,
                scale_down_select=down.select,
            )
        except ValueError as err:
            raise ValueError(f"spec: {err}") from err


class _Rules(NamedTuple):
    """One direction's ``HPAScalingRules`` after ``copyHPAScalingRules`` over the defaults."""

    window: int
    select: SelectPolicy
    policies: tuple[ScalingPolicy, ...]
    tolerance: float | None


def _spec(hpa: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``spec`` of an ``autoscaling/v2`` HorizontalPodAutoscaler; ValueError otherwise."""
    if hpa.get("apiVersion") != "autoscaling/v2":
        raise ValueError(f"apiVersion: expected autoscaling/v2, got {hpa.get('apiVersion')!r}")
    if hpa.get("kind") != "HorizontalPodAutoscaler":
        raise ValueError(f"kind: expected HorizontalPodAutoscaler, got {hpa.get('kind')!r}")
    return _mapping(hpa.get("spec"), "spec")


def _behavior(spec: Mapping[str, Any], downscale_stabilization_s: int) -> tuple[_Rules, _Rules]:
    """The scale-up and scale-down rules of ``spec.behavior``, which the port requires."""
    if "behavior" not in spec:
        raise ValueError(
            "spec.behavior: required (an HPA without behavior takes the controller's legacy "
            "normalizeDesiredReplicas path, which this port does not model)"
        )
    behavior = _mapping(spec["behavior"], "spec.behavior")
    _known_keys(behavior, {"scaleUp", "scaleDown"}, "spec.behavior")
    up = _rules(
        behavior.get("scaleUp"),
        "spec.behavior.scaleUp",
        default_window=DEFAULT_SCALE_UP_STABILIZATION_S,
        default_policies=DEFAULT_SCALE_UP_POLICIES,
    )
    down = _rules(
        behavior.get("scaleDown"),
        "spec.behavior.scaleDown",
        default_window=downscale_stabilization_s,
        default_policies=DEFAULT_SCALE_DOWN_POLICIES,
    )
    return up, down


def _milli_ceil(amount: Decimal) -> int:
    """``Quantity.MilliValue()``: milli-units, rounded up."""
    return int((amount * 1000).to_integral_value(rounding=ROUND_CEILING))


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
) -> _Rules:
    """``copyHPAScalingRules`` over the defaults."""
    if value is None:
        return _Rules(default_window, "Max", default_policies, None)
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
    return _Rules(window, cast(SelectPolicy, select), policies, tolerance)


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
