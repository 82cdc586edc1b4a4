"""Edge: any Kubernetes object dict -> the matching typed pulumi_kubernetes resource.

Built-in kinds map by convention: group ``""`` -> ``core``, ``apps`` -> ``apps``,
``rbac.authorization.k8s.io`` -> ``rbac``; the class is
``pulumi_kubernetes.<group>.<version>.<Kind>``.
Kinds of CRDs (Karpenter ``NodePool``, ``PrometheusRule``) become ``CustomResource``. Nodes
are never created by gpupool, only patched: ``Node`` becomes ``NodePatch`` (server-side apply).
Top-level fields other than ``apiVersion``/``kind`` pass through as resource arguments.
Objects of ``meta.RETAINED_KINDS`` (namespaces, claims) get ``retain_on_delete``: removing
them from the policy or ``pulumi destroy`` drops them from the stack, never from the
cluster, as Argo CD and Flux do with the annotations they carry.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import pulumi
from pulumi_kubernetes.apiextensions import CustomResource

from infra.builders.meta import RETAINED_KINDS, Manifest
from infra.bundle import logical_name

PATCHED_KINDS = frozenset({"Node"})
"""Kinds gpupool only patches (the objects exist already); declared as ``<Kind>Patch``."""


def resource_class(api_version: str, kind: str) -> type[pulumi.CustomResource] | None:
    """The typed pulumi_kubernetes class for a built-in kind; None for CRD kinds."""
    group, _, version = api_version.rpartition("/")
    if group and "." in group and not group.endswith(".k8s.io"):
        return None  # a CRD group (karpenter.sh, monitoring.coreos.com, ...)
    package = "core" if not group else group.split(".")[0]
    class_name = f"{kind}Patch" if kind in PATCHED_KINDS else kind
    try:
        module = importlib.import_module(f"pulumi_kubernetes.{package}.{version}")
    except ModuleNotFoundError:
        return None
    found = getattr(module, class_name, None)
    return found if isinstance(found, type) and issubclass(found, pulumi.CustomResource) else None


def declare(obj: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Create the resource that applies ``obj`` (``opts`` plus ``retain_on_delete`` for the
    kinds no deletion may reach)."""
    name = logical_name(obj)
    api_version, kind = obj["apiVersion"], obj["kind"]
    if kind in RETAINED_KINDS:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(retain_on_delete=True))
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    cls = resource_class(api_version, kind)
    if cls is None:
        return CustomResource(name, api_version=api_version, kind=kind, opts=opts, **fields)
    args: dict[str, Any] = {_snake(k): v for k, v in fields.items()}
    return cls(name, opts=opts, **args)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
