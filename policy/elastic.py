"""When flex capacity grows and sheds, and how fast the autoscaler may follow."""

from __future__ import annotations

from pydantic import Field, model_validator

from policy.base import MAX_REPLICAS, Fraction, Invariants, StrictModel


class ElasticThresholds(StrictModel):
    """Band on PRODUCTION's utilization of the pools' GPUs (fractions, 0-1).

    The signal is the cluster GPU utilization with flex's own load left out: the
    duty cycle of every GPU a production pod holds (dcgm-exporter, joined to pods of the
    production PriorityClass), summed, over all schedulable GPUs of the pools. A busy flex
    fleet never moves it, so flex cannot shed itself while production is idle. Below
    ``grow_while_production_below`` flex grows into unallocated GPUs (less every pool's
    reserve); above ``shed_while_production_above`` it sheds one HPA step; in between it
    holds. Independently of the band, flex sheds whenever the unallocated GPUs fall under
    the pools' reserves (docs/policy.md "How the flex budget is computed").
    """

    grow_while_production_below: Fraction = 0.35
    """Grow flex while production keeps less than this share of the pools' GPUs busy
    (default: 35 %)."""
    shed_while_production_above: Fraction = 0.65
    """Shed flex while production keeps more than this share of the pools' GPUs busy
    (default: 65 %): production needs most of the cluster."""

    @model_validator(mode="after")
    def _band(self) -> ElasticThresholds:
        found = Invariants()
        found.require(
            self.grow_while_production_below < self.shed_while_production_above,
            "grow_while_production_below",
            f"grow_while_production_below ({self.grow_while_production_below}) must be below "
            f"shed_while_production_above ({self.shed_while_production_above}); otherwise "
            "flex capacity flaps between growing and shedding",
        )
        found.raise_if_any()
        return self


class Autoscaling(StrictModel):
    """HPA ``behavior`` shared by every flex workload's HorizontalPodAutoscaler."""

    scale_up_stabilization_s: int = Field(180, ge=0, le=3600)
    """HPA ``behavior.scaleUp.stabilizationWindowSeconds`` (default: 3 min)."""
    scale_down_stabilization_s: int = Field(300, ge=0, le=3600)
    """HPA ``behavior.scaleDown.stabilizationWindowSeconds`` (default: 5 min)."""
    scale_up_pods_per_minute: int = Field(2, ge=1, le=MAX_REPLICAS)
    """Most replicas one workload may add per minute (the HPA policy's int32 ``value``; at
    most 5,000, the most replicas a workload may have)."""
    scale_down_pods_per_minute: int = Field(1, ge=1, le=MAX_REPLICAS)
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
