"""The compaction sidecar of a flex pod, as plain Kubernetes dicts for the Deployment builder.

The vLLM container loads the plugin (``vllm_plugin_env``); the sidecar reaches it over a unix
socket in a memory-backed ``emptyDir`` shared by the two containers only, with a token from a
Secret. Both containers must run as the same user (the socket is mode 0600): set the pod's
``securityContext.runAsUser``.
"""

from __future__ import annotations

from typing import Any

from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.kvcache.plugin import ENABLE_ENV, SOCKET_ENV, TOKEN_FILE_ENV

CONTROL_DIR = "/run/gpupool"
SOCKET_PATH = f"{CONTROL_DIR}/kv.sock"
TOKEN_DIR = "/etc/gpupool/kv-token"
TOKEN_PATH = f"{TOKEN_DIR}/token"
POLICY_DIR = "/etc/gpupool/policy"
POLICY_CONFIGMAP = "gpupool-policy"
"""ConfigMap holding ``pool.yaml`` (the policy the sidecar reads its triggers from)."""
CONTROL_VOLUME, TOKEN_VOLUME, POLICY_VOLUME = (
    "gpupool-kv-control",
    "gpupool-kv-token",
    "gpupool-policy",
)


def token_secret_name(workload: FlexWorkload) -> str:
    """Secret (key ``token``) shared by the plugin and the sidecar of ``workload``."""
    return f"{workload.name}-kv-token"


def vllm_plugin_env() -> list[dict[str, str]]:
    """Environment of the vLLM container that activates the plugin and its control socket.

    The plugin renames block ids in the V1 model runner's tables; vLLM 0.32 picks Model
    Runner V2 by default when Triton is present (GPUs), so the V1 runner is requested."""
    return [
        {"name": ENABLE_ENV, "value": "1"},
        {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"},
        {"name": SOCKET_ENV, "value": SOCKET_PATH},
        {"name": TOKEN_FILE_ENV, "value": TOKEN_PATH},
    ]


def vllm_plugin_mounts() -> list[dict[str, Any]]:
    """Volume mounts the vLLM container needs for the control socket and its token."""
    return [
        {"name": CONTROL_VOLUME, "mountPath": CONTROL_DIR},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]


def compaction_volumes(workload: FlexWorkload) -> list[dict[str, Any]]:
    """Pod volumes: the socket directory (memory), the token Secret, the policy ConfigMap."""
    return [
        {"name": CONTROL_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {
            "name": TOKEN_VOLUME,
            "secret": {"secretName": token_secret_name(workload), "defaultMode": 0o400},
        },
        {"name": POLICY_VOLUME, "configMap": {"name": POLICY_CONFIGMAP}},
    ]


def compaction_sidecar(policy: PoolPolicy, workload: FlexWorkload) -> dict[str, Any]:
    """Container spec of the compaction worker in ``workload``'s pod."""
    kv = policy.kv_cache
    return {
        "name": "kv-compaction",
        "image": kv.compaction_worker_image,
        "command": ["gpupool", "kv-worker", "run"],
        "args": [
            "--policy",
            f"{POLICY_DIR}/pool.yaml",
            "--metrics-url",
            f"http://127.0.0.1:{workload.port}/metrics",
            "--socket",
            SOCKET_PATH,
            "--token-file",
            TOKEN_PATH,
            "--listen",
            f"0.0.0.0:{kv.compaction_worker_port}",
        ],
        "ports": [{"name": "kv-metrics", "containerPort": kv.compaction_worker_port}],
        "volumeMounts": [
            *vllm_plugin_mounts(),
            {"name": POLICY_VOLUME, "mountPath": POLICY_DIR, "readOnly": True},
        ],
        "resources": {
            "requests": {"cpu": "50m", "memory": "96Mi"},
            "limits": {"cpu": "250m", "memory": "192Mi"},
        },
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }
