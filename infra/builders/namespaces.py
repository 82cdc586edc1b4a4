"""The namespaces gpupool owns: one for flex inference, one for its own components."""

from __future__ import annotations

from infra.builders.meta import Manifest, metadata
from policy import PoolPolicy

POD_SECURITY_LEVEL = "restricted"
"""Pod Security Standard enforced in gpupool's namespaces; every pod gpupool renders meets it."""


def namespaces(policy: PoolPolicy) -> list[Manifest]:
    """Flex and system namespaces, enforcing the restricted Pod Security Standard."""
    out = []
    for name, component in (
        (policy.cluster.flex_namespace, "flex-inference"),
        (policy.cluster.system_namespace, "system"),
    ):
        meta = metadata(name, component)
        meta["labels"] |= {
            f"pod-security.kubernetes.io/{mode}": POD_SECURITY_LEVEL
            for mode in ("enforce", "audit", "warn")
        }
        out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    return out
