"""Objects -> YAML documents with stable file names: the reviewable form of the bundle.

Same objects, same bytes: keys are sorted, the dumper is fixed, and each object's file name
derives from its namespace, kind and name only (never from its position), so adding a
workload adds files and changes nothing else.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.representer import SafeRepresenter

from infra.builders.meta import Manifest

CLUSTER_DIR = "_cluster"
"""Folder of cluster-scoped objects (``_`` cannot start a namespace name, so it never clashes)."""

KUSTOMIZATION = "kustomization.yaml"
"""Lists every object file in apply order, so Flux / Argo CD / ``kubectl apply -k`` take the dir."""

HEADER = "# Rendered by `gpupool render` from the policy; edit the policy, not this file.\n"
"""First line of every rendered file."""


class _BlockTextRepresenter(SafeRepresenter):
    """Multi-line strings (embedded configs, dashboards) as ``|`` blocks: diffs show lines."""

    def represent_str(self, data: str) -> Any:
        style = "|" if "\n" in data else None
        return self.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockTextRepresenter.add_representer(str, _BlockTextRepresenter.represent_str)


class DuplicateObject(ValueError):
    """Two objects would be written to the same file (same namespace, kind and name)."""


def object_path(obj: Manifest) -> str:
    """``<namespace or _cluster>/<kind>-<name>.yaml`` in lower case."""
    meta = obj["metadata"]
    folder = meta.get("namespace", CLUSTER_DIR)
    return f"{folder}/{obj['kind'].lower()}-{meta['name']}.yaml"


def to_yaml(data: Any) -> str:
    """Block-style YAML with sorted keys; byte-identical for equal data."""
    yaml = YAML(typ="safe", pure=True)
    yaml.Representer = _BlockTextRepresenter
    yaml.default_flow_style = False
    yaml.width = 4096  # never fold long strings (args, descriptions): folds hurt diffs
    out = io.StringIO()
    yaml.dump(_sorted(data), out)
    return out.getvalue()


def render_documents(objects: Iterable[Manifest]) -> dict[str, str]:
    """Relative file name -> YAML text, one file per object, plus the kustomization."""
    documents: dict[str, str] = {}
    for obj in objects:
        path = object_path(obj)
        if path in documents:
            raise DuplicateObject(f"two objects render to {path}")
        documents[path] = HEADER + to_yaml(obj)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(documents),
    }
    # The resource order is the apply order: dump it as is, only the top-level keys sorted.
    documents[KUSTOMIZATION] = HEADER + to_yaml(kustomization)
    return documents


def _sorted(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {key: _sorted(data[key]) for key in sorted(data)}
    if isinstance(data, list | tuple):
        return [_sorted(item) for item in data]
    return data
