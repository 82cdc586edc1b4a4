"""The ``gpupool-policy`` ConfigMap: the policy the KV compaction sidecars read their triggers
from (``gpupool kv-worker run --policy``), in the flex namespace.

It restates the whole validated policy (``model_dump(by_alias=True)``), so the sidecar loads it
with the same loader and checks as ``gpupool validate``; a sidecar reads it once at start, so
a policy change reaches running sidecars when their pods are next replaced.
"""

from __future__ import annotations

from alerts.yaml_text import to_yaml
from infra.builders.meta import Manifest, metadata
from policy import PoolPolicy
from runtime.kvcache.sidecar import POLICY_CONFIGMAP, POLICY_FILE


def policy_text(policy: PoolPolicy) -> str:
    """The policy as YAML that ``policy.parse_policy`` turns back into an equal ``PoolPolicy``."""
    return to_yaml(policy.model_dump(by_alias=True, mode="json"))


def policy_config_map(policy: PoolPolicy) -> list[Manifest]:
    """The ConfigMap, or nothing when no workload runs the compaction sidecar."""
    if not any(w.kv_compaction for w in policy.workloads):
        return []
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(
                POLICY_CONFIGMAP, "kv-compaction", namespace=policy.cluster.flex_namespace
            ),
            "data": {POLICY_FILE: policy_text(policy)},
        }
    ]
