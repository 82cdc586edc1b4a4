"""Edge: any Kubernetes object dict -> the matching typed pulumi_kubernetes resource.

Built-in kinds map by convention: group ``""`` -> ``core``, ``apps`` -> ``apps``,
``rbac.authorization.k8s.io`` -> ``rbac``; the class is
``pulumi_kubernetes.<group>.<version>.<Kind>``.
Kinds of CRDs (Karpenter ``NodePool``, ``PrometheusRule``) become ``CustomResource``. Nodes
are never created by gpupool, only patched: ``Node`` becomes ``NodePatch`` (server-side apply).
Top-level fields other than ``apiVersion``/``kind`` pass through as resource arguments.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import pulumi
from pulumi_kubernetes.apiextensions import CustomResource

from infra.builders.meta import Manifest

PATCHED_KINDS = frozenset({"Node"})
"""Kinds gpupool only patches (the objects exist already); declared as ``<Kind>Patch``."""

SHORT_KIND = {
    "PersistentVolumeClaim": "pvc",
    "Service": "svc",
    "PodDisruptionBudget": "pdb",
    "HorizontalPodAutoscaler": "hpa",
}
"""Suffixes of Pulumi child names (``f"{name}-pdb"``); other kinds use the lower-case kind."""


def logical_name(obj: Manifest) -> str:
    """Pulumi name of an object's resource: ``<name>-<short kind>``, unique per kind."""
    kind = obj["kind"]
    return f"{obj['metadata']['name']}-{SHORT_KIND.get(kind, kind.lower())}"


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
    """Create the resource that applies ``obj``."""
    name = logical_name(obj)
    api_version, kind = obj["apiVersion"], obj["kind"]
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    cls = resource_class(api_version, kind)
    if cls is None:
        return CustomResource(name, api_version=api_version, kind=kind, opts=opts, **fields)
    args: dict[str, Any] = {_snake(k): v for k, v in fields.items()}
    return cls(name, opts=opts, **args)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
