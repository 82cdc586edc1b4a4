"""Production in a replay: the policy's production workloads, or a documented rule.

A policy that lists ``production:`` workloads is replayed with them (rule ``policy``): each is
a group of pods of its ``gpus_per_replica`` under its own owner, scaled the way it says it
scales. ``gpu_utilization`` runs the HPA gpupool renders for it (``infra.builders.production
.autoscaler``, through the HPA port's Pods-metric path); ``external`` assumes the owner's HPA
is the same kind of HPA with Kubernetes' default behavior and ``target_utilization`` as its
target; ``fixed`` runs ``max_replicas`` all the time (the owner sized it for its peak, and flex
never gets those GPUs). The trace's busy GPU-equivalents are split between the workloads in
proportion to their ceilings (``max_replicas x gpus_per_replica``); demand above a workload's
ceiling is demand the policy cannot serve, and shows as unserved busy time in the report.

Without production workloads (or with rule ``duty`` / ``held``) production is interchangeable
one-GPU pods: ``duty`` = ceil(busy GPU-equivalents / target utilization), at least 1; ``held``
= the GPUs the trace's instances hold (no consolidation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from infra.builders.production import autoscaler
from policy.pool import PoolPolicy
from runtime.sim.hpa_spec import HpaSpec
from runtime.sim.traces import ProductionTrace

RuleMode = Literal["policy", "duty", "held"]

TRACE_OWNER = "production"
"""Owner of the one-GPU production pods of the ``duty`` and ``held`` rules."""

TRACE_NAMESPACE = "production"
"""Namespace those pods report in (any name outside gpupool's own namespaces)."""


@dataclass(frozen=True)
class ProductionRule:
    """How production replicas follow the trace (see the module docstring)."""

    mode: RuleMode = "policy"
    target_utilization: float = 0.6
    """The ``duty`` rule's target, and the assumed target of ``scale_on: external``."""
    startup_s: float = 300.0
    """Image pull + model load of a new production replica."""

    def replicas(self, trace: ProductionTrace) -> NDArray[np.int64]:
        """One-GPU replicas the ``duty`` / ``held`` rule asks for at each trace step."""
        if self.mode == "held":
            return trace.held.astype(np.int64)
        need = np.ceil(trace.busy / self.target_utilization - 1e-9)
        return np.asarray(np.maximum(need, 1), dtype=np.int64)


Scaling = Literal["trace", "fixed", "hpa"]


@dataclass(frozen=True)
class ProductionGroup:
    """One production workload as the replay runs it."""

    owner: str
    """Unique key of its pods (``namespace/name``; never a flex workload's name)."""
    namespace: str
    pod_prefix: str
    gpus_per_replica: int
    share: float
    """Share of the trace's busy GPU-equivalents this workload serves."""
    scaling: Scaling
    min_replicas: int = 1
    max_replicas: int = 1
    hpa: HpaSpec | None = None
    """The HPA that scales it (``scaling == "hpa"``)."""

    def estimate(self, trace: ProductionTrace, rule: ProductionRule) -> NDArray[np.int64]:
        """Replicas at each trace step with production settled on its target (no lag): what
        the layout is sized by and the first step starts from."""
        if self.scaling == "trace":
            return rule.replicas(trace)
        if self.scaling == "fixed" or self.hpa is None:
            return np.full(trace.held.size, self.max_replicas, dtype=np.int64)
        per_pod = self.hpa.target_average_value * self.gpus_per_replica
        need = np.ceil(trace.busy * self.share / per_pod - 1e-9)
        return np.clip(need, self.min_replicas, self.max_replicas).astype(np.int64)


def production_groups(policy: PoolPolicy, rule: ProductionRule) -> tuple[ProductionGroup, ...]:
    """The production groups a replay of ``policy`` runs under ``rule``."""
    if rule.mode != "policy" or not policy.production:
        return (ProductionGroup(TRACE_OWNER, TRACE_NAMESPACE, TRACE_OWNER, 1, 1.0, "trace"),)
    ceilings = [w.max_replicas * w.gpus_per_replica for w in policy.production]
    groups = []
    for i, (w, ceiling) in enumerate(zip(policy.production, ceilings, strict=True)):
        name = w.name or f"{w.kind.lower()}-{i}"
        hpa: HpaSpec | None = None
        if w.renders_hpa:
            hpa = HpaSpec.from_manifest(autoscaler(policy, w))
        elif w.scale_on == "external":
            hpa = HpaSpec(
                w.min_replicas,
                w.max_replicas,
                rule.target_utilization,
                metric_type="Pods",
            )
        groups.append(
            ProductionGroup(
                owner=f"{w.namespace}/{name}",
                namespace=w.namespace,
                pod_prefix=name,
                gpus_per_replica=w.gpus_per_replica,
                share=ceiling / sum(ceilings),
                scaling="fixed" if hpa is None else "hpa",
                min_replicas=w.min_replicas,
                max_replicas=w.max_replicas,
                hpa=hpa,
            )
        )
    return tuple(groups)


def need_gpus(
    groups: tuple[ProductionGroup, ...], trace: ProductionTrace, rule: ProductionRule
) -> NDArray[np.int64]:
    """GPUs production asks for at each trace step with every group settled (``estimate``)."""
    total = np.zeros(trace.held.size, dtype=np.int64)
    for g in groups:
        total += g.estimate(trace, rule) * g.gpus_per_replica
    return total


def describe(groups: tuple[ProductionGroup, ...], rule: ProductionRule) -> str:
    """How the report's assumptions name what drives production."""
    if groups[0].scaling == "trace":
        if rule.mode == "held":
            return "one-GPU pods, the GPUs the trace's instances hold"
        return f"one-GPU pods, ceil(busy GPU-equivalents / {rule.target_utilization:g}), at least 1"
    parts = []
    for g in groups:
        how = (
            f"{g.max_replicas} replicas (fixed)"
            if g.hpa is None
            else f"HPA on mean duty {g.hpa.target_average_value:g}, "
            f"{g.min_replicas}-{g.max_replicas} replicas"
        )
        parts.append(f"{g.owner} x {g.gpus_per_replica} GPUs, {g.share:.0%} of the load, {how}")
    return "the policy's production workloads: " + "; ".join(parts)
