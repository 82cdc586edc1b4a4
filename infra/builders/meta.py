"""Object metadata every builder shares: the recommended ``app.kubernetes.io`` labels."""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]
"""A Kubernetes object as a plain dict, exactly as it would be written to YAML."""

PART_OF = "gpupool"
"""``app.kubernetes.io/part-of`` of every object; selects everything gpupool manages."""


def labels(component: str, instance: str | None = None) -> dict[str, str]:
    """Recommended labels; ``instance`` names one workload when there are several."""
    out = {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": PART_OF,
        "app.kubernetes.io/component": component,
    }
    if instance is not None:
        out["app.kubernetes.io/instance"] = instance
    return out


def selector_labels(instance: str) -> dict[str, str]:
    """The immutable subset a Deployment selects its pods by (never add to it after release)."""
    return {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/instance": instance}


def metadata(
    name: str, component: str, *, namespace: str | None = None, instance: str | None = None
) -> Manifest:
    """``metadata`` with name, optional namespace and the recommended labels."""
    out: Manifest = {"name": name, "labels": labels(component, instance)}
    if namespace is not None:
        out["namespace"] = namespace
    return out


RETAINED_KINDS = frozenset({"Namespace", "PersistentVolumeClaim"})
"""Kinds nothing gpupool drives ever deletes: a namespace holds the Secrets the operator
created by hand, a claim holds data (KV snapshots, downloaded weights). Removing one from
the policy, deleting the Argo CD Application or Flux Kustomization, or ``pulumi destroy``
leaves it in the cluster; deleting it is a deliberate ``kubectl delete``."""

RETAIN_ANNOTATIONS = {
    # Prune=false: not deleted when it leaves the rendered set; Delete=false: not deleted
    # with the Application. Argo CD reads both from one comma-separated value.
    "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
    # Flux never garbage-collects an object with this annotation (removed from the source or
    # with its Kustomization).
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
}
"""The annotations by which Argo CD and Flux keep an object of ``RETAINED_KINDS``; the Pulumi
program gives the same objects ``retain_on_delete`` (``infra.resources``)."""


def retained(obj: Manifest) -> Manifest:
    """``obj`` with the GitOps keep-annotations when its kind is in ``RETAINED_KINDS``."""
    if obj["kind"] not in RETAINED_KINDS:
        return obj
    meta = obj["metadata"]
    annotations = {**meta.get("annotations", {}), **RETAIN_ANNOTATIONS}
    return {**obj, "metadata": {**meta, "annotations": annotations}}
