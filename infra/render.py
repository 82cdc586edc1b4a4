"""Objects -> YAML documents with stable file names: the reviewable form of the bundle.

Same objects, same bytes: keys are sorted, the dumper is fixed, and each object's file name
derives from its namespace, kind and name only (never from its position), so adding a
workload adds files and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

from alerts.adapter import adapter_fragment, helm_values
from infra.builders.meta import Manifest
from infra.builders.production import kustomize_component
from infra.yaml_text import to_yaml
from policy import PoolPolicy

CLUSTER_DIR = "_cluster"
"""Folder of cluster-scoped objects (``_`` cannot start a namespace name, so it never clashes)."""

KUSTOMIZATION = "kustomization.yaml"
"""Lists every object file in apply order, so Flux / Argo CD / ``kubectl apply -k`` take the dir."""

PRODUCTION_DIR = "_production"
"""Folder of the Kustomize Component for the owner's production workloads (docs/infra.md
"Production workloads"); a Component, not a resource, so the top-level kustomization does
not list it, and ``_`` keeps it from clashing with a namespace folder."""

HEADER = "# Rendered by `gpupool render` from the policy; edit the policy, not this file.\n"
"""First line of every rendered file."""

ADAPTER_DIR = "_prometheus-adapter"
"""Folder of the prometheus-adapter rules to MERGE into the cluster's adapter (docs/alerts.md
"prometheus-adapter: merge the fragment"): ``values.yaml`` for its Helm chart, ``rules.yaml``
for a hand-written ``config.yaml``. Not objects, so the kustomization does not list them."""

ADAPTER_HEADER = (
    "# Merge into your prometheus-adapter configuration; do not replace it (docs/alerts.md).\n"
)


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


def production_documents(policy: PoolPolicy) -> dict[str, str]:
    """``_production/``: the production Component's files; empty without a reference."""
    return {
        f"{PRODUCTION_DIR}/{name}": HEADER + to_yaml(doc, sort_keys=True)
        for name, doc in kustomize_component(policy).items()
    }


def adapter_documents(policy: PoolPolicy) -> dict[str, str]:
    """``_prometheus-adapter/values.yaml`` (Helm ``rules.custom``/``rules.external``) and
    ``_prometheus-adapter/rules.yaml`` (``rules``/``externalRules`` entries of config.yaml)."""
    head = HEADER + ADAPTER_HEADER
    return {
        f"{ADAPTER_DIR}/values.yaml": head + to_yaml(helm_values(policy), sort_keys=False),
        f"{ADAPTER_DIR}/rules.yaml": head + to_yaml(adapter_fragment(policy), sort_keys=False),
    }


def fragment_documents(policy: PoolPolicy) -> dict[str, str]:
    """The files written beside the objects that are not cluster objects: the production
    Component and the prometheus-adapter fragment."""
    return production_documents(policy) | adapter_documents(policy)
