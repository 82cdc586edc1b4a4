"""Production workloads: the cluster owner's Deployments and StatefulSets, declared by reference.

gpupool does not deploy them. It renders what they need to take GPUs back from the flex pool
(the production PriorityClass, tolerations of the pool taints, node affinity that prefers the
prod pool) as a Kustomize Component and as a Pulumi transformation, and, for
``scale_on: gpu_utilization``, their HorizontalPodAutoscaler (docs/infra.md "Production
workloads"). The rules that involve the node pools live on ``PoolPolicy``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import (
    MAX_REPLICAS,
    DnsLabel,
    Invariants,
    ReplicaBound,
    StrictModel,
    is_label_key,
    is_label_value,
)

ProductionKind = Literal["Deployment", "StatefulSet"]
"""Kinds a production reference may name (both ``apps/v1``, both with a pod template)."""

ScaleOn = Literal["fixed", "gpu_utilization", "external"]
"""What sets a production workload's replica count (see ``ProductionWorkload.scale_on``)."""

HPA_ONLY_FIELDS = (
    "target_gpu_utilization",
    "scale_up_stabilization_s",
    "scale_down_stabilization_s",
)
"""Fields that only mean something when gpupool renders the HPA (``gpu_utilization``)."""


class ProductionWorkload(StrictModel):
    """One production Deployment or StatefulSet (or every one matching a label selector)."""

    namespace: DnsLabel
    """Namespace of the workload; never gpupool's flex or system namespace."""
    kind: ProductionKind = "Deployment"
    """``Deployment`` or ``StatefulSet``."""
    name: DnsLabel | None = None
    """Name of the one object this entry refers to. Give ``name`` or ``selector``, not both."""
    selector: dict[str, str] | None = None
    """``matchLabels``-style labels: the entry refers to every object of ``kind`` in
    ``namespace`` whose ``metadata.labels`` include all of them (the Kustomize component
    targets them with a ``labelSelector``). Give ``name`` or ``selector``, not both."""
    gpus_per_replica: int = Field(ge=1, le=64)
    """``nvidia.com/gpu`` each pod requests; at most the prod pool's ``gpus_per_node``."""
    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    """Fewest replicas the workload runs (the HPA's ``minReplicas`` with
    ``gpu_utilization``); together these must fit the prod pool outside its reserve."""
    max_replicas: ReplicaBound
    """Most replicas the workload may reach (the HPA's ``maxReplicas`` with
    ``gpu_utilization``); together these must fit the prod and flex pools."""
    scale_on: ScaleOn = "fixed"
    """What sets the replica count. ``fixed``: the owner's manifests do and gpupool renders no
    HPA. ``gpu_utilization``: gpupool renders an autoscaling/v2 HPA on the mean GPU duty
    cycle of the workload's pods (Pods metric ``gpupool_pod_gpu_utilization``, served by
    prometheus-adapter from dcgm-exporter); needs ``name`` and ``target_gpu_utilization``.
    ``external``: the owner's own HPA does, and gpupool renders nothing for scaling."""
    target_gpu_utilization: float | None = Field(None, gt=0.0, lt=1.0)
    """HPA target: mean GPU duty cycle (0-1) of the pods. Only with ``gpu_utilization``, where
    it is required."""
    scale_up_stabilization_s: int = Field(0, ge=0, le=3600)
    """HPA ``behavior.scaleUp.stabilizationWindowSeconds``; 0 (Kubernetes' default) adds
    replicas as soon as the load is there. Only with ``gpu_utilization``."""
    scale_down_stabilization_s: int = Field(600, ge=0, le=3600)
    """HPA ``behavior.scaleDown.stabilizationWindowSeconds``: production gives GPUs back only
    after this long below target. Only with ``gpu_utilization``."""

    @property
    def renders_hpa(self) -> bool:
        """gpupool renders this workload's HorizontalPodAutoscaler."""
        return self.scale_on == "gpu_utilization"

    @property
    def ref(self) -> str:
        """``namespace/Kind/name`` or ``namespace/Kind/{k=v,...}``: how messages name it."""
        return f"{self.namespace}/{self.kind}/{self.name or '{' + self.label_selector + '}'}"

    @property
    def slot_ref(self) -> str:
        """``namespace/name``: how a pool's slot ``reserve`` names this workload (a selector
        entry has no name and cannot be named)."""
        return f"{self.namespace}/{self.name}"

    @property
    def label_selector(self) -> str:
        """``selector`` as a Kubernetes label-selector string (``k=v,k2=v2``, keys sorted)."""
        return ",".join(f"{k}={v}" for k, v in sorted((self.selector or {}).items()))

    @model_validator(mode="after")
    def _shape(self) -> ProductionWorkload:
        found = Invariants()
        self._check_reference(found)
        self._check_selector(found)
        found.require(
            self.min_replicas <= self.max_replicas,
            "min_replicas",
            f"min_replicas ({self.min_replicas}) must not exceed max_replicas "
            f"({self.max_replicas})",
        )
        if self.renders_hpa:
            self._check_hpa_settings(found)
        else:
            self._check_no_hpa_settings(found)
        found.raise_if_any()
        return self

    def _check_reference(self, found: Invariants) -> None:
        """The entry names one object or selects several, never both or neither."""
        found.require(
            (self.name is None) != (self.selector is None),
            "name",
            "give exactly one of name (one object) or selector (every "
            f"{self.kind} with these labels in {self.namespace}), "
            f"found {'both' if self.name is not None else 'neither'}",
        )

    def _check_selector(self, found: Invariants) -> None:
        """A selector is non-empty (empty matches everything) and made of Kubernetes labels."""
        if self.selector is None:
            return
        found.require(
            bool(self.selector),
            "selector",
            "an empty selector would match every object in the namespace; give labels",
        )
        for key, value in self.selector.items():
            found.require(
                is_label_key(key),
                "selector",
                f"{key!r} is not a Kubernetes label key",
            )
            found.require(
                is_label_value(value),
                "selector",
                f"{value!r} (label {key!r}) is not a Kubernetes label value",
            )

    def _check_hpa_settings(self, found: Invariants) -> None:
        """What the HPA gpupool renders needs: one target object, a target, sane windows."""
        found.require(
            self.name is not None,
            "selector",
            "scale_on: gpu_utilization renders an HPA, whose scaleTargetRef names one "
            "object: use name, or scale_on: external with your own HPAs",
        )
        found.require(
            self.target_gpu_utilization is not None,
            "target_gpu_utilization",
            "required with scale_on: gpu_utilization (the HPA's target mean GPU duty "
            "cycle, e.g. 0.6)",
        )
        found.require(
            self.scale_down_stabilization_s >= self.scale_up_stabilization_s,
            "scale_down_stabilization_s",
            f"scale_down_stabilization_s ({self.scale_down_stabilization_s}) must be at "
            f"least scale_up_stabilization_s ({self.scale_up_stabilization_s}): "
            "production should give GPUs back slower than it takes them",
        )

    def _check_no_hpa_settings(self, found: Invariants) -> None:
        """Without a rendered HPA its fields stay at their defaults (they would do nothing).

        Compared with the default, not ``model_fields_set``: a dumped policy (the
        gpupool-policy ConfigMap) writes every field and must load back."""
        for field in HPA_ONLY_FIELDS:
            found.require(
                getattr(self, field) == type(self).model_fields[field].default,
                field,
                f"only used with scale_on: gpu_utilization (gpupool renders no HPA for "
                f"scale_on: {self.scale_on}); remove it",
            )
