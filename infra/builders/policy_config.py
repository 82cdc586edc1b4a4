"""The ``gpupool-policy`` ConfigMap: the policy the KV compaction sidecars read their triggers
from (``gpupool kv-sidecar run --policy``) and the snapshot GCs their timings
(``gpupool kv-snapshots gc --policy``), in the flex namespace.

It restates the validated policy without its ``workloads`` list (``model_dump(by_alias=True)``),
so the sidecar loads it with the same loader and checks as ``gpupool validate``. The
workloads are left out because no trigger reads them: the ConfigMap then stays the same size
however many workloads there are (ConfigMaps are capped at 1 MiB) and adding a workload does
not change it. Running sidecars pick up a changed ConfigMap between polls, without a restart
(``runtime/kvcache/sidecar/policy_file.py``); the volume must therefore be mounted whole, not by
``subPath``.
"""

from __future__ import annotations

from infra.builders.compaction_sidecar import POLICY_CONFIGMAP, POLICY_FILE
from infra.builders.meta import Manifest, metadata
from infra.builders.snapshot_gc import preserving
from infra.yaml_text import to_yaml
from policy import PoolPolicy


def sidecar_policy(policy: PoolPolicy) -> PoolPolicy:
    """What the sidecars read: the policy with an empty ``workloads`` list."""
    return policy.model_copy(update={"workloads": []})


def policy_text(policy: PoolPolicy) -> str:
    """``policy`` as YAML that ``policy.parse_policy`` turns back into an equal ``PoolPolicy``."""
    return to_yaml(policy.model_dump(by_alias=True, mode="json"), sort_keys=False)


def policy_config_map(policy: PoolPolicy) -> list[Manifest]:
    """The ConfigMap, or nothing when no pod runs a sidecar that reads it (the compaction
    sidecar, or the snapshot GC: its timings; its capacity is an argument)."""
    if not (preserving(policy) or any(w.kv_compaction for w in policy.workloads)):
        return []
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(
                POLICY_CONFIGMAP, "kv-compaction", namespace=policy.cluster.flex_namespace
            ),
            "data": {POLICY_FILE: policy_text(sidecar_policy(policy))},
        }
    ]
