"""How flex pods leave: PDBs, spreading, and a grace period that covers drain plus KV snapshot.

The order of a flex pod's exit (docs/serving.md, "The shutdown order"): the preStop hook
fails readiness first (a drain marker the readiness probe checks), sleeps
``prestop_delay_s`` while routing drops the pod, and only then does vLLM get SIGTERM and
drain for ``drain_s``. vLLM itself never refuses a request cleanly once it has SIGTERM (new
requests get an empty 200, then hang, then 500), so readiness must have failed, and had time
to reach every router, before that.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import MAX_REPLICAS, Invariants, StrictModel

MIN_GRACE_S = 30
"""The product's floor for flex pods' ``terminationGracePeriodSeconds``."""

MAX_GRACE_S = 3600
"""The most any part of a flex pod's exit may take: production waits that long for GPUs."""


class Disruption(StrictModel):
    """Eviction behaviour of every flex workload."""

    termination_grace_s: int = Field(45, ge=MIN_GRACE_S, le=MAX_GRACE_S)
    """Pod ``terminationGracePeriodSeconds``: at least 30 s, and drain + snapshot must fit."""
    drain_s: int = Field(25, ge=1, le=MAX_GRACE_S)
    """Seconds vLLM drains in-flight requests on SIGTERM (``--shutdown-timeout``)."""
    prestop_delay_s: int = Field(5, ge=0, le=MAX_GRACE_S)
    """preStop sleep after the hook has failed readiness, so every router drops the pod
    before vLLM gets SIGTERM (after which vLLM answers new requests with empty 200s). Must
    exceed ``readiness_period_s`` x ``readiness_failure_threshold``."""
    readiness_period_s: int = Field(1, ge=1, le=60)
    """Period (and timeout) of the vLLM container's readiness probe, which fails once the
    preStop hook has written the drain marker. Short, because routing can only drop the pod
    after the probe has failed ``readiness_failure_threshold`` times within the preStop
    sleep; the probe is a shell test plus one local HTTP request."""
    readiness_failure_threshold: int = Field(3, ge=1, le=10)
    """Consecutive failed readiness probes before the pod is unready: tolerates that many
    seconds (x ``readiness_period_s``) of a busy vLLM event loop without flapping, and
    bounds how long the drain marker takes to turn the pod unready."""
    snapshot_s: int = Field(10, ge=0, le=MAX_GRACE_S)
    """Budget to write the KV-cache snapshot to the volume before the kill."""
    pdb_min_available: int = Field(0, ge=0, le=MAX_REPLICAS)
    """PodDisruptionBudget ``minAvailable`` for each flex workload; below every workload's
    ``min_replicas``, or a drain at the floor would never finish. 0 (the default: flex is
    best-effort and one replica is the usual floor) never blocks a drain; with
    ``min_replicas`` >= 2, 1 keeps a replica serving through drains."""
    anti_affinity: Literal["preferred", "required"] = "preferred"
    """How a workload's replicas keep apart. ``preferred`` (the default): spread over zones
    (``topology.kubernetes.io/zone``), a preference weaker than packing flex onto the nodes
    that already run flex, so replicas share nodes and free GPUs stay whole.
    ``required``: also never two replicas on one node. That costs production room: each
    replica takes a node of its own, so 1-GPU replicas leave one GPU used on many nodes and
    no node with room for a multi-GPU production replica (production then preempts flex or
    waits; a slot ``reserve`` sheds flex), and replicas beyond the pools' node count stay
    Pending. Only for a workload that must survive losing a node (docs/design/lending.md)."""

    @property
    def readiness_fail_s(self) -> int:
        """Worst case from the drain marker to the pod's Ready condition turning false: the
        next probe starts within one period and the threshold-th failure ends the streak (a
        failing probe answers at once: the marker test runs before any HTTP call)."""
        return self.readiness_period_s * self.readiness_failure_threshold

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
        found.require(
            self.readiness_fail_s < self.prestop_delay_s,
            "prestop_delay_s",
            f"readiness_period_s ({self.readiness_period_s}) x readiness_failure_threshold "
            f"({self.readiness_failure_threshold}) = {self.readiness_fail_s} s must be below "
            f"prestop_delay_s ({self.prestop_delay_s}): the preStop hook fails readiness and "
            "sleeps prestop_delay_s before vLLM gets SIGTERM, and the rest of the sleep is the "
            "time the API server, the endpoint picker and the proxies have to drop the pod; "
            "after SIGTERM vLLM answers new requests with empty 200s, then errors. Raise "
            "prestop_delay_s (and termination_grace_s) or probe more often",
        )
        found.raise_if_any()
        return self
