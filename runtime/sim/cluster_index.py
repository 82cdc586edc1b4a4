"""The cluster model's counters: each pool's nodes in masks by placement class, its GPUs by
owner, and each owner's pods by phase, kept as the cluster changes so that a scheduling
choice reads a few dozen masks instead of every node (``runtime.sim.cluster``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from runtime.sim.cluster_objects import Node, Phase, Pod

NodeClass = tuple[int, int, int]
"""(free GPUs, flex pods, GPUs) of a node: what its placement score depends on."""


@dataclass(eq=False)
class PoolIndex:
    """One pool's nodes in masks by ``NodeClass`` (a bit per node, in name order) and its GPU
    counters; ``index`` redoes the masks when Karpenter adds or removes nodes."""

    nodes: list[Node]
    by_bit: list[Node] = field(default_factory=list)
    bit: dict[Node, int] = field(default_factory=dict)
    masks: dict[NodeClass, int] = field(default_factory=dict)
    gpus: int = 0
    free: int = 0
    bound: Counter[str] = field(default_factory=Counter)
    """GPUs bound pods of each owner hold here (terminating ones included)."""
    running: Counter[str] = field(default_factory=Counter)
    """GPUs running pods of each owner hold here."""

    def index(self) -> None:
        self.by_bit = sorted(self.nodes, key=lambda n: n.name)
        self.bit = {n: i for i, n in enumerate(self.by_bit)}
        self.masks = {}
        for node in self.by_bit:
            self.add(node)
        self.gpus = sum(n.gpus for n in self.nodes)
        self.free = sum(n.free for n in self.nodes)

    def add(self, node: Node) -> None:
        key = (node.free, node.packed, node.gpus)
        self.masks[key] = self.masks.get(key, 0) | 1 << self.bit[node]

    def remove(self, node: Node) -> None:
        key = (node.free, node.packed, node.gpus)
        mask = self.masks[key] & ~(1 << self.bit[node])
        if mask:
            self.masks[key] = mask
        else:
            del self.masks[key]

    def highest(self, mask: int) -> Node:
        """The highest-named node of ``mask``."""
        return self.by_bit[mask.bit_length() - 1]


@dataclass(eq=False)
class OwnerPods:
    """One owner's pods that count toward its replicas (not terminating), in creation order,
    and its live pods by phase."""

    production: bool
    order: dict[Pod, None] = field(default_factory=dict)
    phases: dict[Phase, set[Pod]] = field(
        default_factory=lambda: {phase: set() for phase in Phase if phase is not Phase.GONE}
    )
    sizes: Counter[tuple[Phase, int]] = field(default_factory=Counter)
    """Pods by (phase, GPUs per pod)."""
