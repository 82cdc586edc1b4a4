"""The snapshot side of a flex pod with ``kv_preservation: filesystem``, as plain dicts.

vLLM writes the snapshot volume through gpupool's ``SnapshotTier`` (runtime.kvcache.
preservation.tier), which vLLM imports from the gpupool tree the plugin initContainer copies
(``plugin_installer``; the compaction plugin itself stays off: preservation excludes
compaction). The ``kv-snapshot-gc`` sidecar bounds the volume and exports the tier's
metrics on the pod's KV sidecar port (``kv-metrics``, ``kv_cache.compaction_sidecar_port``:
a pod runs the compaction sidecar or this one, never both).
"""

from __future__ import annotations

from typing import Any

from infra.builders.compaction_sidecar import (
    PLUGIN_TREE,
    PLUGIN_VOLUME,
    POLICY_CONFIGMAP,
    POLICY_DIR,
    POLICY_FILE,
    POLICY_VOLUME,
    metrics_endpoint,
)
from infra.builders.pod import container_security
from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.kvcache.preservation.status import POD_ENV

SNAPSHOT_VOLUME = "kv-snapshots"
POD_NAME_ENV: dict[str, Any] = {
    "name": POD_ENV,
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
}
"""The pod's name: the tier's status record and the GC's own record are keyed by it."""


def preserving(policy: PoolPolicy) -> bool:
    """Whether flex pods keep their KV on the snapshot volume (and so mount it at all)."""
    return policy.kv_cache.kv_preservation == "filesystem"


def snapshot_claim_name(workload: FlexWorkload) -> str:
    """Name of the workload's KV-snapshot PersistentVolumeClaim."""
    return f"{workload.name}-kv-snapshots"


def vllm_snapshot_env() -> list[dict[str, Any]]:
    """What the vLLM container needs to import and run the tier."""
    return [{"name": "PYTHONPATH", "value": PLUGIN_TREE}, POD_NAME_ENV]


def vllm_snapshot_mounts(workload: FlexWorkload) -> list[dict[str, Any]]:
    return [
        {"name": SNAPSHOT_VOLUME, "mountPath": workload.snapshot_volume.mount_path},
        {"name": PLUGIN_VOLUME, "mountPath": PLUGIN_TREE, "readOnly": True},
    ]


def snapshot_volumes(workload: FlexWorkload) -> list[dict[str, Any]]:
    """Pod volumes: the snapshot claim, the policy (the GC's bounds), the gpupool tree."""
    return [
        {
            "name": SNAPSHOT_VOLUME,
            "persistentVolumeClaim": {"claimName": snapshot_claim_name(workload)},
        },
        {"name": POLICY_VOLUME, "configMap": {"name": POLICY_CONFIGMAP}},
        {"name": PLUGIN_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
    ]


def snapshot_gc(policy: PoolPolicy, workload: FlexWorkload) -> dict[str, Any]:
    """Container spec of the snapshot GC in ``workload``'s pod."""
    port = policy.kv_cache.compaction_sidecar_port
    return {
        "name": "kv-snapshot-gc",
        "image": policy.cluster.runtime_image,
        "command": ["gpupool", "kv-snapshots", "gc"],
        "args": [
            "--root",
            workload.snapshot_volume.mount_path,
            "--capacity-bytes",
            str(workload.snapshot_volume.capacity_bytes),
            "--policy",
            f"{POLICY_DIR}/{POLICY_FILE}",
            "--listen",
            f"0.0.0.0:{port}",
        ],
        "env": [POD_NAME_ENV],
        **metrics_endpoint(port),
        "volumeMounts": [
            {"name": SNAPSHOT_VOLUME, "mountPath": workload.snapshot_volume.mount_path},
            {"name": POLICY_VOLUME, "mountPath": POLICY_DIR, "readOnly": True},
        ],
        "resources": {
            "requests": {"cpu": "50m", "memory": "96Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "securityContext": container_security(),
    }
