"""Three PriorityClasses: production above training above the default, idle inference below it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import Invariants, PriorityClassName, StrictModel

MAX_USER_PRIORITY = 1_000_000_000
"""Kubernetes reserves values above one billion for system-critical classes."""


class PriorityTier(StrictModel):
    """A PriorityClass."""

    name: PriorityClassName
    """PriorityClass name that workloads reference in ``priorityClassName`` (a DNS subdomain;
    the ``system-`` prefix is Kubernetes')."""
    value: int = Field(ge=-MAX_USER_PRIORITY, le=MAX_USER_PRIORITY)
    """Scheduling priority; higher preempts lower."""
    preemption_policy: Literal["PreemptLowerPriority", "Never"]
    """``Never``: pods of this tier wait instead of evicting others."""
    description: str
    """Shown by ``kubectl get priorityclass``."""


class Priorities(StrictModel):
    """The three tiers; ordering is an invariant: production > training > 0 > idle inference."""

    production: PriorityTier = PriorityTier(
        name="gpupool-production",
        value=1_000_000,
        preemption_policy="PreemptLowerPriority",
        description="Production LLM inference: never preempted by the other gpupool tiers.",
    )
    """Production inference: the highest tier."""
    training: PriorityTier = PriorityTier(
        name="gpupool-training",
        value=100_000,
        preemption_policy="PreemptLowerPriority",
        description="Important training jobs: below production, above default workloads.",
    )
    """Important training: the middle tier."""
    idle_inference: PriorityTier = PriorityTier(
        name="gpupool-idle-inference",
        value=-1,
        preemption_policy="Never",
        description="Idle-time (flex) inference: below default pods, evicted by anything.",
    )
    """Idle-time inference on gpu-flex: negative, so even default-priority pods evict it."""

    @model_validator(mode="after")
    def _ordered(self) -> Priorities:
        found = Invariants()
        found.require(
            self.production.value > self.training.value,
            "production.value",
            f"production ({self.production.value}) must be above training "
            f"({self.training.value}) so training can never preempt production",
        )
        found.require(
            self.training.value > 0,
            "training.value",
            f"training ({self.training.value}) must be above 0, the default priority",
        )
        found.require(
            self.idle_inference.value < 0,
            "idle_inference.value",
            f"idle_inference ({self.idle_inference.value}) must be below 0 so "
            "default-priority pods can evict flex inference",
        )
        found.require(
            self.idle_inference.preemption_policy == "Never",
            "idle_inference.preemption_policy",
            "idle-time inference must not preempt anything; set Never",
        )
        names = [self.production.name, self.training.name, self.idle_inference.name]
        found.require(
            len(set(names)) == 3, "production.name", f"tier names must differ, found {names}"
        )
        found.raise_if_any()
        return self
