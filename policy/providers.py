"""Karpenter provider data: each provider's NodeClass, restricted label domain and GPU labels,
and the kubernetes.io labels the NodePool CRD accepts (data the policy models check against,
kept apart from them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KarpenterProvider:
    """What gpupool uses of one Karpenter provider's API (sources: docs/infra.md)."""

    node_class_group: str
    """API group of the provider's NodeClass."""
    node_class_kind: str
    """Kind of the provider's NodeClass."""
    well_known: frozenset[str]
    """The labels of the provider's own (restricted) domain that requirements may name."""
    gpu_name: str
    """Label naming an instance type's GPU."""
    gpu_count: str
    """Label counting an instance type's GPUs."""
    gpu_memory_mib: str | None
    """Label of the memory of one GPU in MiB; None where the provider publishes none."""
    gpu_names: Mapping[str, str]
    """GPU family (``gpu_family``) -> the provider's value of ``gpu_name``."""
    smallest_gpu_mib: Mapping[str, int]
    """Without a memory label: GPU family -> the smallest memory of one GPU (MiB) among the
    instance types whose ``gpu_name`` is that family's value."""

    @property
    def domain(self) -> str:
        """The provider's restricted label domain."""
        return self.gpu_name.split("/")[0]


AWS = KarpenterProvider(
    node_class_group="karpenter.k8s.aws",
    node_class_kind="EC2NodeClass",
    well_known=frozenset(
        f"karpenter.k8s.aws/{name}"
        for name in (
            "capacity-reservation-id",
            "capacity-reservation-type",
            "instance-hypervisor",
            "instance-encryption-in-transit-supported",
            "instance-category",
            "instance-family",
            "instance-generation",
            "instance-size",
            "instance-local-nvme",
            "instance-cpu",
            "instance-cpu-manufacturer",
            "instance-cpu-sustained-clock-speed-mhz",
            "instance-memory",
            "instance-ebs-bandwidth",
            "instance-network-bandwidth",
            "instance-gpu-name",
            "instance-gpu-manufacturer",
            "instance-gpu-count",
            "instance-gpu-memory",
            "instance-accelerator-name",
            "instance-accelerator-manufacturer",
            "instance-accelerator-count",
        )
    ),
    gpu_name="karpenter.k8s.aws/instance-gpu-name",
    gpu_count="karpenter.k8s.aws/instance-gpu-count",
    gpu_memory_mib="karpenter.k8s.aws/instance-gpu-memory",
    # The provider lower-cases EC2's GPU name (p5e/p5en: h200, p5: h100, p4d/p4de: a100,
    # p6-b200: b200, g6e: l40s, g5: a10g, g4dn: t4).
    gpu_names={
        "H200": "h200",
        "H100": "h100",
        "A100": "a100",
        "B200": "b200",
        "L40S": "l40s",
        "A10G": "a10g",
        "T4": "t4",
    },
    smallest_gpu_mib={},
)
"""karpenter-provider-aws (``pkg/apis/v1/labels.go``, docs/reference/instance-types.md)."""

AZURE = KarpenterProvider(
    node_class_group="karpenter.azure.com",
    node_class_kind="AKSNodeClass",
    well_known=frozenset(
        f"karpenter.azure.com/{name}"
        for name in (
            "sku-name",
            "sku-family",
            "sku-series",
            "sku-version",
            "sku-cpu",
            "sku-memory",
            "sku-networking-accelerated",
            "sku-storage-premium-capable",
            "sku-storage-ephemeralos-maxsize",
            "sku-gpu-name",
            "sku-gpu-manufacturer",
            "sku-gpu-count",
            "placement-scope",
        )
    ),
    gpu_name="karpenter.azure.com/sku-gpu-name",
    gpu_count="karpenter.azure.com/sku-gpu-count",
    gpu_memory_mib=None,
    # The accelerator part of the VM size's name (Standard_ND96isr_H200_v5: H200,
    # Standard_NC24ads_A100_v4: A100); sizes without one (ND96asr_v4) carry no GPU name.
    gpu_names={"H200": "H200", "H100": "H100", "A100": "A100"},
    # ND H200 v5: 141 GiB; H100: ND H100 v5 80 GiB (NC H100 v5 94 GiB); A100 with the name in
    # the size: 80 GiB.
    smallest_gpu_mib={"H200": 144384, "H100": 81920, "A100": 81920},
)
"""karpenter-provider-azure (``pkg/apis/v1beta1/labels.go``, ``setRequirementsGPU``)."""

PROVIDERS: Mapping[str, KarpenterProvider] = {"aws": AWS, "azure": AZURE}
"""The providers ``karpenter.cloud`` may name; ``gcp`` is refused (``KarpenterSettings``)."""

KUBERNETES_IO_ALLOWED = frozenset(
    {
        "beta.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "node.kubernetes.io/windows-build",
    }
)
"""The kubernetes.io labels the NodePool CRD accepts in requirements (its CEL rule)."""
