"""Objects -> YAML documents with stable file names: the reviewable form of the bundle.

Same objects, same bytes: keys are sorted, the dumper is fixed, and each object's file name
derives from its namespace, kind and name only (never from its position), so adding a
workload adds files and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.builders.meta import Manifest
from infra.yaml_text import to_yaml

CLUSTER_DIR = "_cluster"
"""Folder of cluster-scoped objects (``_`` cannot start a namespace name, so it never clashes)."""

KUSTOMIZATION = "kustomization.yaml"
"""Lists every object file in apply order, so Flux / Argo CD / ``kubectl apply -k`` take the dir."""

HEADER = "# Rendered by `gpupool render` from the policy; edit the policy, not this file.\n"
"""First line of every rendered file."""


class DuplicateObject(ValueError):
    """Two objects would be written to the same file (same namespace, kind and name)."""


def object_path(obj: Manifest) -> str:
    """``<namespace or _cluster>/<kind>-<name>.yaml`` in lower case."""
    meta = obj["metadata"]
    folder = meta.get("namespace", CLUSTER_DIR)
    return f"{folder}/{obj['kind'].lower()}-{meta['name']}.yaml"


def render_documents(objects: Iterable[Manifest]) -> dict[str, str]:
    """Relative file name -> YAML text, one file per object, plus the kustomization."""
    documents: dict[str, str] = {}
    for obj in objects:
        path = object_path(obj)
        if path in documents:
            raise DuplicateObject(f"two objects render to {path}")
        documents[path] = HEADER + to_yaml(obj, sort_keys=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(documents),
    }
    # The resource order is the apply order: the list keeps it, only the keys are sorted.
    documents[KUSTOMIZATION] = HEADER + to_yaml(kustomization, sort_keys=True)
    return documents
