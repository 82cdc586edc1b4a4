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
