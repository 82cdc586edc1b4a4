"""When flex capacity grows and sheds, and how fast the autoscaler may follow."""

from __future__ import annotations

from pydantic import Field, model_validator

from policy.base import Fraction, Invariants, StrictModel


class ElasticThresholds(StrictModel):
    """Hysteresis band on cluster GPU utilization (fractions of all GPUs, 0-1).

    Below ``scale_up_below`` flex capacity grows; above ``shed_above`` it is shed; in
    between it holds. The gap is the hysteresis that stops flapping.
    """

    scale_up_below: Fraction = 0.35
    """Grow flex while cluster GPU utilization is below this (brief: 35 %)."""
    shed_above: Fraction = 0.65
    """Shed flex while cluster GPU utilization is above this (brief: 65 %)."""
    idle_gpu_below: Fraction = 0.30
    """A GPU whose own utilization is below this counts as idle headroom flex may use."""
    flex_target_utilization: Fraction = 0.40
    """Utilization a flex GPU should reach before more flex replicas are worth adding.

    Together with ``idle_gpu_below`` this is the brief's 30-40 % usable-utilization band.
    """

    @model_validator(mode="after")
    def _band(self) -> ElasticThresholds:
        found = Invariants()
        found.require(
            self.scale_up_below < self.shed_above,
            "scale_up_below",
            f"scale_up_below ({self.scale_up_below}) must be below shed_above "
            f"({self.shed_above}); otherwise flex capacity flaps between growing and shedding",
        )
        found.require(
            self.idle_gpu_below <= self.flex_target_utilization,
            "idle_gpu_below",
            f"idle_gpu_below ({self.idle_gpu_below}) must not exceed flex_target_utilization "
            f"({self.flex_target_utilization}): a GPU cannot be idle above its target",
        )
        found.raise_if_any()
        return self


class Autoscaling(StrictModel):
    """HPA ``behavior`` shared by every flex workload's HorizontalPodAutoscaler."""

    scale_up_stabilization_s: int = Field(180, ge=0, le=3600)
    """HPA ``behavior.scaleUp.stabilizationWindowSeconds`` (brief: 3 min)."""
    scale_down_stabilization_s: int = Field(300, ge=0, le=3600)
    """HPA ``behavior.scaleDown.stabilizationWindowSeconds`` (brief: 5 min)."""
    scale_up_pods_per_minute: int = Field(2, ge=1)
    """Most replicas one workload may add per minute."""
    scale_down_pods_per_minute: int = Field(1, ge=1)
    """Most replicas one workload may remove per minute (evictions handle emergencies)."""

    @model_validator(mode="after")
    def _windows(self) -> Autoscaling:
        found = Invariants()
        found.require(
            self.scale_down_stabilization_s >= self.scale_up_stabilization_s,
            "scale_down_stabilization_s",
            f"scale_down_stabilization_s ({self.scale_down_stabilization_s}) must be at least "
            f"scale_up_stabilization_s ({self.scale_up_stabilization_s}); shrinking faster "
            "than growing makes flex capacity oscillate",
        )
        found.raise_if_any()
        return self
