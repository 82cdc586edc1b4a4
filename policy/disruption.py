"""How flex pods leave: PDBs, spreading, and a grace period that covers drain plus KV snapshot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import Invariants, StrictModel

MIN_GRACE_S = 30
"""The brief's floor for flex pods' ``terminationGracePeriodSeconds``."""


class Disruption(StrictModel):
    """Eviction behaviour of every flex workload."""

    termination_grace_s: int = Field(45, ge=MIN_GRACE_S, le=3600)
    """Pod ``terminationGracePeriodSeconds``: at least 30 s, and drain + snapshot must fit."""
    drain_s: int = Field(25, ge=1)
    """Seconds vLLM drains in-flight requests on SIGTERM (``--shutdown-timeout``)."""
    prestop_delay_s: int = Field(5, ge=0)
    """preStop sleep so endpoints drop the pod before vLLM stops taking requests."""
    snapshot_s: int = Field(10, ge=0)
    """Budget to write the KV-cache snapshot to the volume before the kill."""
    pdb_min_available: int = Field(0, ge=0)
    """PodDisruptionBudget ``minAvailable`` for each flex workload; below every workload's
    ``min_replicas``, or a drain at the floor would never finish. 0 (the default: flex is
    best-effort and one replica is the usual floor) never blocks a drain; with
    ``min_replicas`` >= 2, 1 keeps a replica serving through drains."""
    anti_affinity: Literal["preferred", "required"] = "preferred"
    """Spread replicas across nodes; ``required`` refuses to co-locate at all."""

    @property
    def shutdown_budget_s(self) -> int:
        """Seconds a pod needs from SIGTERM to exit cleanly; the grace period must cover it."""
        return self.prestop_delay_s + self.drain_s + self.snapshot_s

    @model_validator(mode="after")
    def _fits(self) -> Disruption:
        found = Invariants()
        found.require(
            self.termination_grace_s >= self.shutdown_budget_s,
            "termination_grace_s",
            f"termination_grace_s ({self.termination_grace_s}) < prestop_delay_s "
            f"({self.prestop_delay_s}) + drain_s ({self.drain_s}) + snapshot_s "
            f"({self.snapshot_s}) = {self.shutdown_budget_s}: the kubelet would kill the pod "
            "mid-drain; raise termination_grace_s or shorten the budgets",
        )
        found.raise_if_any()
        return self
