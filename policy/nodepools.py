"""GPU node pools: the guaranteed production pool and the elastic flex pool(s)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from policy.base import (
    MAX_NODES,
    MAX_REPLICAS,
    DnsLabel,
    DnsSubdomain,
    Fraction,
    Invariants,
    LabelKey,
    LabelValue,
    StrictModel,
)
from policy.karpenter import KarpenterSettings, NodeRequirement, gpu_family
from policy.providers import PROVIDERS

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
"""What a taint does to pods that do not tolerate it."""

POOL_TAINT_EFFECT: TaintEffect = "NoSchedule"
"""Effect of the pool taint: keeps pods that do not tolerate the pool off its nodes."""

GPU_TAINT_KEY = "nvidia.com/gpu"
"""Taint key some GPU node images set (GKE GPU node pools, EKS GPU node groups); every pod
gpupool renders tolerates it (``Exists``, effect ``NoSchedule``)."""


class NodeTaint(StrictModel):
    """A taint the nodes of a pool carry besides the pool taint."""

    key: LabelKey
    """Taint key (``nvidia.com/gpu``, ``dedicated``)."""
    value: LabelValue | None = None
    """Taint value; unset (or empty) for a taint without one."""
    effect: TaintEffect
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``."""


@dataclass(frozen=True)
class PoolReserve:
    """A pool's reserve as the budget applies it: a share of its GPUs (``ratio``), or
    ``slots`` free places of ``slot_gpus`` GPUs on single nodes."""

    ratio: float = 0.0
    slots: int = 0
    slot_gpus: int = 1

    def gpus(self, schedulable: int) -> int:
        """GPUs kept free in a pool of ``schedulable`` GPUs whose free slots are intact."""
        if self.slots:
            return self.slots * self.slot_gpus if schedulable else 0
        return math.floor(schedulable * self.ratio)

    def describe(self) -> str:
        if self.slots:
            return f"{self.slots} slots of {self.slot_gpus} GPUs"
        return f"reserve_ratio {self.ratio:g}"


class SlotReserve(StrictModel):
    """Room for whole production replicas, kept unallocated in a pool.

    Free GPUs help production only where a replica fits: four GPUs free on four nodes are no
    room for a 4-GPU replica. A slot is ``gpus_per_replica`` of the production workload
    ``of`` free on one node; the flex budget keeps ``replicas`` such slots free and sheds
    flex when fewer exist, however many GPUs are free in all."""

    replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Production replicas the pool keeps room for."""
    of: str = Field(min_length=3)
    """The production workload whose replicas the slots fit: ``namespace/name`` of an entry
    of ``production`` (its ``gpus_per_replica`` is the slot size)."""


class GpuCost(StrictModel):
    """What one GPU of the pool costs an hour: the what-if and the advisor value the GPU-hours
    flex harvests there at this price."""

    gpu_hour: float = Field(gt=0, le=10_000)
    """Price of one GPU for one hour (an H200 on demand is a few units of currency)."""
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    """ISO 4217 code: ``USD``, ``EUR``; every priced pool uses the same one."""


class NodePool(StrictModel):
    """One GPU node pool; ``prod`` pools are guaranteed, ``flex`` pools are elastic."""

    name: DnsLabel
    """Pool name, used as the value of the pool label and taint (``gpu-prod``, ``gpu-flex``)."""
    role: Literal["prod", "flex"]
    """``prod``: production inference and key training. ``flex``: idle-time inference."""
    gpu_model: LabelValue = Field(min_length=1)
    """GPU product as dcgm/GPU feature discovery reports it (``nvidia.com/gpu.product``)."""
    gpus_per_node: int = Field(8, ge=1, le=64)
    """GPUs on each node of the pool."""
    gpu_memory_gib: float = Field(gt=0, le=1024)
    """Memory of one GPU in GiB as the driver reports it (H200: 140, H100: 79.6); sizes the KV."""
    max_nodes: int = Field(ge=1, le=MAX_NODES)
    """Upper bound on nodes; sets the Karpenter limit and the pool's GPU capacity (at most
    5,000, the largest cluster Kubernetes supports)."""
    reserve_ratio: Fraction = 0.0
    """Share of the pool's GPUs kept free for production's bursts, a fraction (0.2 keeps 20 %
    of them free); flex never counts on them. The simple form of ``reserve``."""
    reserve: SlotReserve | None = None
    """Room kept free for whole production replicas (``{replicas: 2, of:
    inference/llama-70b-prod}``): the budget keeps that many replica slots free on single
    nodes. Give this or ``reserve_ratio``, not both."""
    cost: GpuCost | None = None
    """Price of the pool's GPUs (``{gpu_hour: 3.10, currency: USD}``); reports then show what
    the GPU-hours flex harvests there are worth. Unset: GPU-hours only."""
    lend_idle: bool = False
    """A ``prod`` pool lends its unallocated GPUs beyond its reserve to flex workloads, which
    production takes back by preemption the moment it needs them (docs/policy.md "Lending").
    Flex pools always serve flex, so the field is for ``prod`` pools only."""
    nodes: tuple[DnsSubdomain, ...] = ()
    """Existing nodes that form the pool (``labels`` target: they get the label and taint):
    Node names, DNS-1123 subdomains (EKS: ``ip-10-0-1-23.ec2.internal``); each in one pool."""
    taint: bool = True
    """Taint the pool's nodes so only workloads that tolerate the pool land there."""
    taints: tuple[NodeTaint, ...] = ()
    """Every other taint the pool's nodes carry, such as ``nvidia.com/gpu=present:NoSchedule``
    where the GPU image or operator sets it. A node's taints are one atomic list: the
    ``labels`` target writes the whole of it (the pool taint, then these), so a taint not
    declared here is removed from the node; the ``karpenter`` target gives new nodes the same
    list. Only taints gpupool's pods tolerate are accepted (``PreferNoSchedule``, or
    ``nvidia.com/gpu`` with ``NoSchedule``)."""
    karpenter: KarpenterSettings = KarpenterSettings()
    """Provisioning settings used by the ``karpenter`` target."""

    @property
    def gpu_capacity(self) -> int:
        """GPUs the pool may hold at its largest."""
        return self.max_nodes * self.gpus_per_node

    @property
    def gpu_memory_mib(self) -> int:
        """``gpu_memory_gib`` in MiB, rounded up: the least memory per GPU an instance type
        may have, since vLLM's KV cache is sized from it."""
        return math.ceil(self.gpu_memory_gib * 1024)

    @property
    def karpenter_requirements(self) -> tuple[NodeRequirement, ...]:
        """Every requirement of the pool's Karpenter NodePool, in order: capacity types,
        instance types (when set), the GPUs from ``karpenter.cloud`` (the GPU name of
        ``gpu_model``, ``gpus_per_node`` GPUs and, where the provider labels it, at least
        ``gpu_memory_mib`` per GPU), then ``karpenter.requirements``."""
        settings = self.karpenter
        out = [
            NodeRequirement(
                key="karpenter.sh/capacity-type", operator="In", values=settings.capacity_types
            )
        ]
        if settings.instance_types:
            out.append(
                NodeRequirement(
                    key="node.kubernetes.io/instance-type",
                    operator="In",
                    values=settings.instance_types,
                )
            )
        provider = settings.provider
        if provider is not None:
            name = provider.gpu_names[gpu_family(self.gpu_model)]
            out.append(NodeRequirement(key=provider.gpu_name, operator="In", values=(name,)))
            count = str(self.gpus_per_node)
            out.append(NodeRequirement(key=provider.gpu_count, operator="In", values=(count,)))
            if provider.gpu_memory_mib is not None:
                floor = str(self.gpu_memory_mib - 1)  # Gt: more than one MiB below the floor
                out.append(
                    NodeRequirement(key=provider.gpu_memory_mib, operator="Gt", values=(floor,))
                )
        return (*out, *settings.requirements)

    def check(self, at: str, found: Invariants) -> None:
        found.require(
            not (self.lend_idle and self.role == "flex"),
            f"{at}.lend_idle",
            "a flex pool always serves flex workloads; lend_idle is for prod pools (remove it)",
        )
        found.require(
            self.reserve is None or self.reserve_ratio == 0,
            f"{at}.reserve",
            f"give reserve (production replica slots) or reserve_ratio ({self.reserve_ratio}, "
            "a share of the GPUs), not both",
        )
        found.require(
            self.role == "prod" or self.reserve_ratio < 1.0,
            f"{at}.reserve_ratio",
            f"a flex pool reserving {self.reserve_ratio} of its GPUs can run nothing; "
            "use a value below 1",
        )
        found.require(
            not self.nodes or len(self.nodes) <= self.max_nodes,
            f"{at}.nodes",
            f"{len(self.nodes)} nodes listed but max_nodes is {self.max_nodes}; "
            "raise max_nodes or list fewer nodes",
        )
        self._check_taints(at, found)
        self._check_karpenter_gpus(at, found)

    def _check_taints(self, at: str, found: Invariants) -> None:
        """The API server keeps one taint per key and effect; gpupool's pods must tolerate
        every taint declared (they tolerate the pool taint and ``nvidia.com/gpu``)."""
        seen: set[tuple[str, str]] = set()
        for i, taint in enumerate(self.taints):
            found.require(
                (taint.key, taint.effect) not in seen,
                f"{at}.taints.{i}",
                f"taint {taint.key}:{taint.effect} is repeated; a node holds one taint per key "
                "and effect",
            )
            seen.add((taint.key, taint.effect))
            found.require(
                taint.effect == "PreferNoSchedule"
                or (taint.key == GPU_TAINT_KEY and taint.effect == POOL_TAINT_EFFECT),
                f"{at}.taints.{i}",
                f"gpupool's flex and production pods tolerate the pool taint and "
                f"{GPU_TAINT_KEY}:{POOL_TAINT_EFFECT} only, so {taint.key}:{taint.effect} would "
                "keep them off the pool; remove the taint from the nodes or make it "
                "PreferNoSchedule",
            )

    def _check_karpenter_gpus(self, at: str, found: Invariants) -> None:
        """The derived GPU requirements exist for ``gpu_model``, and no GPU they (or explicit
        requirements on a GPU-memory label) allow holds less than ``gpu_memory_gib``: vLLM's
        KV cache is sized from it."""
        settings = self.karpenter
        provider = settings.provider
        if provider is not None:
            family = gpu_family(self.gpu_model)
            found.require(
                family in provider.gpu_names,
                f"{at}.gpu_model",
                f"no {settings.cloud} Karpenter GPU name is known for {self.gpu_model!r} (family "
                f"{family}; known: {', '.join(sorted(provider.gpu_names))}); for the karpenter "
                f"target set {at}.karpenter.cloud: none and select the instances with "
                f"{at}.karpenter.requirements or instance_types",
            )
            smallest = provider.smallest_gpu_mib.get(family)
            found.require(
                smallest is None
                or bool(settings.instance_types)
                or self.gpu_memory_mib <= smallest,
                f"{at}.gpu_memory_gib",
                f"{provider.gpu_name} {provider.gpu_names.get(family)} also selects GPUs of "
                f"{smallest} MiB ({(smallest or 0) / 1024:g} GiB), and {settings.cloud} publishes "
                f"no GPU-memory label to exclude them: vLLM's KV cache sized for "
                f"{self.gpu_memory_gib:g} GiB would not fit there; lower gpu_memory_gib or pin "
                "karpenter.instance_types",
            )
        memory_labels = {p.gpu_memory_mib for p in PROVIDERS.values() if p.gpu_memory_mib}
        bounded = [
            (i, req) for i, req in enumerate(settings.requirements) if req.key in memory_labels
        ]
        if bounded:
            least = max(req.lower_bound for _, req in bounded)
            found.require(
                least >= self.gpu_memory_mib,
                f"{at}.karpenter.requirements.{bounded[0][0]}",
                f"these requirements allow GPUs with {least} MiB, less than the "
                f"{self.gpu_memory_mib} MiB (gpu_memory_gib {self.gpu_memory_gib:g}) vLLM's KV "
                f"cache is sized for; require {bounded[0][1].key} Gt "
                f"{self.gpu_memory_mib - 1} or lower gpu_memory_gib",
            )
