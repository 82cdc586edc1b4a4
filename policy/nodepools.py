"""GPU node pools: the guaranteed production pool and the elastic flex pool(s)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from policy.base import DnsLabel, Fraction, Invariants, StrictModel


class KarpenterSettings(StrictModel):
    """How a pool is provisioned when the stack's node-pool target is ``karpenter``."""

    node_class: str = "default"
    """Name of the cloud NodeClass (for example an ``EC2NodeClass``) the NodePool references."""
    node_class_kind: str = "EC2NodeClass"
    """Kind of the NodeClass; ``EC2NodeClass`` on AWS, ``AKSNodeClass`` on Azure."""
    node_class_group: str = "karpenter.k8s.aws"
    """API group of the NodeClass."""
    instance_types: tuple[str, ...] = ()
    """Allowed instance types (``node.kubernetes.io/instance-type``); empty allows any."""
    capacity_types: tuple[Literal["on-demand", "spot", "reserved"], ...] = ("on-demand",)
    """``karpenter.sh/capacity-type`` values; flex pools may add ``spot``."""
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmpty"
    """When Karpenter may remove nodes. ``WhenEmpty`` never disrupts running GPU pods."""
    consolidate_after: str = Field("10m", pattern=r"^(([0-9]+(s|m|h))+|Never)$")
    """How long a node must be empty (or underused) before Karpenter removes it (``30s``,
    ``10m``, ``1h``, or ``Never``: the NodePool CRD's pattern)."""
    disruption_budget_nodes: str = Field("10%", pattern=r"^((100|[0-9]{1,2})%|[0-9]+)$")
    """Most nodes Karpenter may disrupt at once in this pool: a count (``2``) or ``0-100%``."""


class NodePool(StrictModel):
    """One GPU node pool; ``prod`` pools are guaranteed, ``flex`` pools are elastic."""

    name: DnsLabel
    """Pool name, used as the value of the pool label and taint (``gpu-prod``, ``gpu-flex``)."""
    role: Literal["prod", "flex"]
    """``prod``: production inference and key training. ``flex``: idle-time inference."""
    gpu_model: str = Field(min_length=1)
    """GPU product as dcgm/GPU feature discovery reports it (``nvidia.com/gpu.product``)."""
    gpus_per_node: int = Field(8, ge=1, le=64)
    """GPUs on each node of the pool."""
    gpu_memory_gib: float = Field(gt=0, le=1024)
    """Memory of one GPU in GiB as the driver reports it (H200: 140, H100: 79.6); sizes the KV."""
    max_nodes: int = Field(ge=1)
    """Upper bound on nodes; sets the Karpenter limit and the pool's GPU capacity."""
    reserve_ratio: Fraction = 0.0
    """Share of the pool's GPUs kept free for bursts; flex load never counts on them."""
    nodes: tuple[DnsLabel, ...] = ()
    """Existing nodes that form the pool (``labels`` target: they get the label and taint)."""
    taint: bool = True
    """Taint the pool's nodes so only workloads that tolerate the pool land there."""
    karpenter: KarpenterSettings = KarpenterSettings()
    """Provisioning settings used by the ``karpenter`` target."""

    @property
    def gpu_capacity(self) -> int:
        """GPUs the pool may hold at its largest."""
        return self.max_nodes * self.gpus_per_node

    def check(self, at: str, found: Invariants) -> None:
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
