"""The objects of the cluster model: nodes, pods, their phases, why a pod waits, evictions.

``runtime.sim.cluster.Cluster`` creates and changes them; everything else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Phase(Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    TERMINATING = "Terminating"
    GONE = "Gone"


@dataclass(eq=False)
class Node:
    name: str
    pool: str
    gpus: int
    free: int
    ready_at: float = 0.0
    empty_since: float | None = 0.0
    pods: set[Pod] = field(default_factory=set)
    packed: int = 0
    """Flex pods (``Pod.packs``) bound here, terminating ones included (the affinity term)."""


@dataclass(eq=False)
class Pod:
    """One pod of a production or flex Deployment (``owner``)."""

    uid: int
    owner: str
    production: bool
    gpus: int
    priority: int
    may_preempt: bool
    pools: tuple[str, ...]
    """Pools the pod may land on, preferred first."""
    created: float
    startup_s: float
    phase: Phase = Phase.PENDING
    node: Node | None = None
    nominated: Node | None = None
    ready_at: float = 0.0
    exit_at: float = 0.0
    pending_since: float = 0.0
    packs: bool = False
    """Scored like a flex pod: preferred pool, nodes running flex, least allocated."""


class Waiting(Enum):
    """Why a pending pod is not bound yet."""

    PREEMPTION = "preemption"
    """Nominated to a node whose victims are still exiting."""
    FRAGMENTED = "fragmented"
    """Enough GPUs are free in its pools, but on no single node."""
    CAPACITY = "capacity"
    """Its pools lack the free GPUs (or the node is still being provisioned)."""


@dataclass(frozen=True)
class Eviction:
    """A pod disrupted by someone other than its owner (here: scheduler preemption)."""

    pod: Pod
    at: float
    reason: str
