"""GPU node pools: the guaranteed production pool and the elastic flex pool(s)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

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
from policy.providers import KUBERNETES_IO_ALLOWED, PROVIDERS, KarpenterProvider

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
"""What a taint does to pods that do not tolerate it."""

POOL_TAINT_EFFECT: TaintEffect = "NoSchedule"
"""Effect of the pool taint: keeps pods that do not tolerate the pool off its nodes."""

GPU_TAINT_KEY = "nvidia.com/gpu"
"""Taint key some GPU node images set (GKE GPU node pools, EKS GPU node groups); every pod
gpupool renders tolerates it (``Exists``, effect ``NoSchedule``)."""

Cloud = Literal["aws", "azure", "gcp", "none"]
"""Karpenter provider whose well-known labels select a pool's GPUs (``none``: the policy's
``requirements`` alone)."""

_DURATION_RUN = r"([0-9]+(s|m|h))+"
_KARPENTER_DURATION = rf"^{_DURATION_RUN}$"
"""Karpenter's duration pattern (``30s``, ``10m``, ``720h``, ``1h30m``)."""
_KARPENTER_DURATION_OR_NEVER = rf"^({_DURATION_RUN}|Never)$"
"""The NodePool CRD's pattern of a duration that may be switched off (``Never``)."""

KARPENTER_DURATION_MAX_S = 8784 * 3600
"""Longest Karpenter duration gpupool accepts (8784h, a leap year): a node's lifetime and
drain are hours to weeks; Go's ``time.Duration`` overflows past about 2,562,047h."""


def gpu_family(gpu_model: str) -> str:
    """The family of a GPU feature discovery product name, upper case: what the clouds'
    GPU-name labels encode (``NVIDIA-H100-80GB-HBM3`` -> ``H100``, ``Tesla-T4`` -> ``T4``)."""
    name = re.sub(r"^(NVIDIA|Tesla)[- ]", "", gpu_model, flags=re.IGNORECASE)
    return re.split(r"[- ]", name, maxsplit=1)[0].upper()


def _restricted_key_problem(key: str) -> str | None:
    """Why the NodePool CRD (its CEL rules) or a provider rejects ``key`` in a requirement."""
    domain = key.split("/")[0]  # the CRD's ``find("^([^/]+)")``: the whole key without '/'
    if key == "kubernetes.io/hostname":
        return "kubernetes.io/hostname is restricted: Karpenter sets it on every node"
    if (
        domain.endswith("kubernetes.io")
        and key not in KUBERNETES_IO_ALLOWED
        and not domain.endswith(("node.kubernetes.io", "node-restriction.kubernetes.io"))
    ):
        return (
            f"label domain kubernetes.io is restricted: {key} is none of "
            f"{sorted(KUBERNETES_IO_ALLOWED)} and not under node.kubernetes.io or "
            "node-restriction.kubernetes.io"
        )
    if domain.endswith("k8s.io") and not domain.endswith("kops.k8s.io"):
        return f"label domain k8s.io is restricted (only kops.k8s.io), found {key}"
    if domain.endswith("karpenter.sh") and key not in (
        "karpenter.sh/capacity-type",
        "karpenter.sh/nodepool",
    ):
        return f"label domain karpenter.sh is restricted (capacity-type, nodepool), found {key}"
    for provider in PROVIDERS.values():
        if domain.endswith(provider.domain) and key not in provider.well_known:
            return (
                f"label domain {provider.domain} is restricted to the provider's well-known "
                f"labels ({', '.join(sorted(provider.well_known))}), found {key}"
            )
    return None


def karpenter_seconds(value: str) -> int:
    """Seconds in a Karpenter duration (``1h30m``)."""
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)([smh])", value))


class NodeRequirement(StrictModel):
    """One requirement of a Karpenter NodePool: a node selector requirement and ``minValues``."""

    key: LabelKey = Field(max_length=316)
    """Node label the requirement constrains (``topology.kubernetes.io/zone``,
    ``karpenter.k8s.aws/instance-family``, ``node.kubernetes.io/instance-type``)."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the node's value of ``key`` must relate to ``values``."""
    values: tuple[LabelValue, ...] = ()
    """Label values: at least one for ``In``/``NotIn``, none for ``Exists``/``DoesNotExist``,
    one non-negative integer for ``Gt``/``Lt``."""
    min_values: int | None = Field(None, ge=1, le=50)
    """Karpenter's ``minValues``: the least number of distinct values of ``key`` among the
    instance types Karpenter may choose from (``In`` needs at least that many ``values``)."""

    @model_validator(mode="after")
    def _valid(self) -> NodeRequirement:
        found = Invariants()
        problem = _restricted_key_problem(self.key)
        found.require(problem is None, "key", problem or "")
        op, count = self.operator, len(self.values)
        if op in ("In", "NotIn"):
            found.require(count > 0, "values", f"operator {op} needs at least one value")
        elif op in ("Exists", "DoesNotExist"):
            found.require(count == 0, "values", f"operator {op} takes no values, found {count}")
        else:
            found.require(
                count == 1 and re.fullmatch(r"[0-9]+", self.values[0]) is not None,
                "values",
                f"operator {op} needs exactly one non-negative integer, found {list(self.values)}",
            )
        found.require(
            self.min_values is None or op != "In" or count >= self.min_values,
            "min_values",
            f"min_values {self.min_values} needs at least as many values, found {count}",
        )
        found.raise_if_any()
        return self

    @property
    def lower_bound(self) -> int:
        """The least integer value a node may have for ``key`` under this requirement (0 when
        it does not bound the value from below)."""
        if self.operator == "Gt":
            return int(self.values[0]) + 1
        if self.operator == "In" and all(re.fullmatch(r"[0-9]+", v) for v in self.values):
            return min(int(v) for v in self.values)
        return 0


class NodeTaint(StrictModel):
    """A taint the nodes of a pool carry besides the pool taint."""

    key: LabelKey
    """Taint key (``nvidia.com/gpu``, ``dedicated``)."""
    value: LabelValue | None = None
    """Taint value; unset (or empty) for a taint without one."""
    effect: TaintEffect
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``."""


class KarpenterSettings(StrictModel):
    """How a pool is provisioned when the stack's node-pool target is ``karpenter``."""

    cloud: Cloud = "aws"
    """Karpenter provider whose well-known labels select the pool's GPUs from ``gpu_model``,
    ``gpus_per_node`` and ``gpu_memory_gib``: ``aws`` (``karpenter.k8s.aws/instance-gpu-name``,
    ``-count``, ``-memory``), ``azure`` (``karpenter.azure.com/sku-gpu-name``, ``-count``) or
    ``none`` (``requirements`` or ``instance_types`` alone select them). ``gcp`` is refused:
    GKE has no Karpenter, and the community provider's labels are not verified here."""
    requirements: tuple[NodeRequirement, ...] = ()
    """More NodePool requirements (zones, architecture, instance families), ANDed with the
    derived ones; with ``cloud: none`` they select the GPU instances."""
    node_class: DnsSubdomain = "default"
    """Name of the cloud NodeClass (for example an ``EC2NodeClass``) the NodePool references."""
    node_class_kind: str | None = Field(None, pattern=r"^[A-Z][A-Za-z0-9]{0,62}$")
    """Kind of the NodeClass; default: the cloud's (``EC2NodeClass`` on aws, ``AKSNodeClass``
    on azure); required with ``cloud: none``."""
    node_class_group: DnsSubdomain | None = None
    """API group of the NodeClass; default: the cloud's (``karpenter.k8s.aws``,
    ``karpenter.azure.com``); required with ``cloud: none``."""
    instance_types: tuple[LabelValue, ...] = ()
    """Allowed instance types (``node.kubernetes.io/instance-type``); empty allows any that
    the GPU requirements allow."""
    capacity_types: tuple[Literal["on-demand", "spot", "reserved"], ...] = ("on-demand",)
    """``karpenter.sh/capacity-type`` values; flex pools may add ``spot``."""
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmpty"
    """When Karpenter may remove nodes. ``WhenEmpty`` never disrupts running GPU pods."""
    consolidate_after: str = Field("10m", pattern=_KARPENTER_DURATION_OR_NEVER)
    """How long a node must be empty (or underused) before Karpenter removes it (``30s``,
    ``10m``, ``1h``, or ``Never``: the NodePool CRD's pattern)."""
    disruption_budget_nodes: str = Field("10%", pattern=r"^((100|[0-9]{1,2})%|[0-9]+)$")
    """Most nodes Karpenter may disrupt at once in this pool: a count (``2``) or ``0-100%``."""
    expire_after: str = Field("720h", pattern=_KARPENTER_DURATION_OR_NEVER)
    """Age at which Karpenter replaces a node (``720h``, Karpenter's default, or ``Never``).
    Expiry is forceful: budgets do not delay it, and with ``termination_grace_period`` set,
    pods still running at that deadline are deleted."""
    termination_grace_period: str | None = Field(None, pattern=_KARPENTER_DURATION)
    """Longest a node may take to drain once Karpenter disrupts it (``2h``); after it, pods
    are deleted even against their PDBs. Unset: a drain waits for the PDBs. At least
    ``disruption.termination_grace_s`` keeps the flex drain and KV snapshot whole."""

    @model_validator(mode="after")
    def _consistent(self) -> KarpenterSettings:
        found = Invariants()
        provider = PROVIDERS.get(self.cloud)
        found.require(
            self.cloud != "gcp",
            "cloud",
            "gcp is not supported: GKE has no Karpenter of its own and the community "
            "karpenter-provider-gcp's GPU labels are not verified by gpupool; use cloud: none "
            "with requirements (or instance_types) that select the GPU machines, and "
            "node_class_group/node_class_kind of your provider's NodeClass",
        )
        if self.cloud == "none":
            found.require(
                self.node_class_group is not None and self.node_class_kind is not None,
                "node_class_kind",
                f"cloud {self.cloud} has no default NodeClass: set node_class_group and "
                "node_class_kind (the API group and kind of your provider's NodeClass)",
            )
            found.require(
                bool(self.requirements or self.instance_types),
                "requirements",
                f"cloud {self.cloud}: requirements or instance_types must select the pool's "
                "GPU instances; a NodePool without them lets Karpenter launch any instance "
                "type (set cloud: aws or azure to derive them from gpu_model)",
            )
        elif provider is not None:
            found.require(
                self.node_class_group in (None, provider.node_class_group),
                "node_class_group",
                f"cloud {self.cloud} provisions with {provider.node_class_kind} in "
                f"{provider.node_class_group}, found {self.node_class_group!r}; set cloud to "
                "your provider (or none, with requirements of your own)",
            )
        owned = {
            "karpenter.sh/capacity-type": "karpenter.capacity_types",
            "node.kubernetes.io/instance-type": "karpenter.instance_types",
        }
        if provider is not None:
            derived = (provider.gpu_name, provider.gpu_count, provider.gpu_memory_mib)
            owned |= {key: "gpu_model, gpus_per_node and gpu_memory_gib" for key in derived if key}
        for i, req in enumerate(self.requirements):
            source = owned.get(req.key)
            found.require(
                source is None,
                f"requirements.{i}.key",
                f"{req.key} is derived from {source}; set it there"
                + (" (or cloud: none to write the GPU requirements yourself)" if provider else ""),
            )
            other = next(
                (
                    name
                    for name, p in PROVIDERS.items()
                    if name != self.cloud and req.key.split("/")[0].endswith(p.domain)
                ),
                None,
            )
            found.require(
                other is None or provider is None,
                f"requirements.{i}.key",
                f"{req.key} is a label of the {other} provider but cloud is {self.cloud}",
            )
        for field in ("consolidate_after", "expire_after", "termination_grace_period"):
            value = getattr(self, field)
            found.require(
                value in (None, "Never") or karpenter_seconds(value) <= KARPENTER_DURATION_MAX_S,
                field,
                f"expected a duration of at most {KARPENTER_DURATION_MAX_S // 3600}h (about a "
                f"year; Karpenter parses it as a Go time.Duration) such as 720h, found {value!r}",
            )
        found.require(
            self.expire_after == "Never" or karpenter_seconds(self.expire_after) > 0,
            "expire_after",
            f"expected a positive duration or Never (0 replaces every node as soon as it is "
            f"ready), found {self.expire_after!r}",
        )
        found.require(
            self.termination_grace_period is None
            or karpenter_seconds(self.termination_grace_period) > 0,
            "termination_grace_period",
            "expected a positive duration (0 deletes every pod the moment its node drains), "
            f"found {self.termination_grace_period!r}",
        )
        found.raise_if_any()
        return self

    @property
    def provider(self) -> KarpenterProvider | None:
        """The provider ``cloud`` names; None for ``none``."""
        return PROVIDERS.get(self.cloud)

    @property
    def node_class_ref(self) -> tuple[str, str, str]:
        """``(group, kind, name)`` of the NodeClass, the cloud's defaults filled in."""
        provider = self.provider
        group = self.node_class_group or (provider.node_class_group if provider else "")
        kind = self.node_class_kind or (provider.node_class_kind if provider else "")
        return group, kind, self.node_class


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
