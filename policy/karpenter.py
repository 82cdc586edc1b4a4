"""Karpenter provisioning of a pool: its settings, its NodePool requirements and the
NodePool CRD's rules on them (the provider tables are in ``policy.providers``)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from policy.base import (
    DnsSubdomain,
    Invariants,
    LabelKey,
    LabelValue,
    StrictModel,
)
from policy.providers import KUBERNETES_IO_ALLOWED, PROVIDERS, KarpenterProvider

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
        self._check_cloud(found)
        self._check_node_class(found)
        self._check_requirement_keys(found)
        self._check_durations(found)
        found.raise_if_any()
        return self

    def _check_cloud(self, found: Invariants) -> None:
        """``gcp`` is refused with the way around it."""
        found.require(
            self.cloud != "gcp",
            "cloud",
            "gcp is not supported: GKE has no Karpenter of its own and the community "
            "karpenter-provider-gcp's GPU labels are not verified by gpupool; use cloud: none "
            "with requirements (or instance_types) that select the GPU machines, and "
            "node_class_group/node_class_kind of your provider's NodeClass",
        )

    def _check_node_class(self, found: Invariants) -> None:
        """``none`` names its NodeClass and selects its instances itself; a provider's cloud
        keeps the provider's NodeClass group."""
        provider = PROVIDERS.get(self.cloud)
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

    def _check_requirement_keys(self, found: Invariants) -> None:
        """No requirement on a key gpupool derives from other fields, nor on another
        provider's labels."""
        provider = PROVIDERS.get(self.cloud)
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

    def _check_durations(self, found: Invariants) -> None:
        """Durations Go can parse, and none that replaces or kills at once."""
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
