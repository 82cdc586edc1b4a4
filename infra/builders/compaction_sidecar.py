"""The compaction sidecar of a flex pod, as plain Kubernetes dicts for the Deployment builder.

The vLLM container loads the plugin (``vllm_plugin_env``); the sidecar reaches it over a unix
socket in a memory-backed ``emptyDir`` shared by the two containers only, with a token from a
Secret. Both containers must run as the same user (the socket is mode 0600): set the pod's
``securityContext.runAsUser``.

The stock vLLM image lacks gpupool: ``plugin_installer`` is an initContainer that copies the
gpupool tree the runtime image carries (``pip install --no-deps --target``, dist-info
included, so vLLM finds the ``vllm.general_plugins`` entry point) into an ``emptyDir`` that
the vLLM container mounts and puts on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

from infra.builders.pod import container_security
from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.kvcache.in_vllm.plugin import ENABLE_ENV, SOCKET_ENV, TOKEN_FILE_ENV

METRICS_PORT = "kv-metrics"
"""Name of the sidecar's port: ``/metrics`` (plugin + sidecar metrics), ``POST /shrink`` and
``POST /compaction-requests``."""
CONTROL_DIR = "/run/gpupool"
SOCKET_PATH = f"{CONTROL_DIR}/kv.sock"
TOKEN_DIR = "/etc/gpupool/kv-token"
TOKEN_PATH = f"{TOKEN_DIR}/token"
COMPACTION_TOKEN_DIR = "/etc/gpupool/compaction-token"
"""Where the shared compaction token (``tuner.compaction_token_secret``) is mounted."""
POLICY_DIR = "/etc/gpupool/policy"
POLICY_CONFIGMAP = "gpupool-policy"
"""ConfigMap holding ``pool.yaml`` (the policy the sidecar reads its triggers from)."""
POLICY_FILE = "pool.yaml"
"""Key of the policy in ``POLICY_CONFIGMAP`` (a file under ``POLICY_DIR`` in the sidecar)."""
PLUGIN_TREE = "/opt/gpupool/vllm-plugin"
"""Where the runtime image keeps gpupool's ``--no-deps --target`` tree, and where the vLLM
container mounts its copy (infra/images/runtime.Dockerfile builds it)."""
PLUGIN_STAGING = "/gpupool-plugin"
"""Mount point of the plugin ``emptyDir`` inside the initContainer (the copy's destination)."""
CONTROL_VOLUME, TOKEN_VOLUME, POLICY_VOLUME, PLUGIN_VOLUME, COMPACTION_TOKEN_VOLUME = (
    "gpupool-kv-control",
    "gpupool-kv-token",
    "gpupool-policy",
    "gpupool-plugin",
    "gpupool-compaction-token",
)


def token_secret_name(workload: FlexWorkload) -> str:
    """Secret (key ``token``) shared by the plugin and the sidecar of ``workload``."""
    return f"{workload.name}-kv-token"


def compaction_service_name(workload: FlexWorkload) -> str:
    """Headless Service resolving to every pod of ``workload`` (the tuner's fan-out target)."""
    return f"{workload.name}-kv-compaction"


def compaction_service_address(policy: PoolPolicy, workload: FlexWorkload) -> str:
    """``HOST:PORT`` the tuner posts compaction requests to (``--compaction-service``)."""
    host = f"{compaction_service_name(workload)}.{policy.cluster.flex_namespace}.svc"
    return f"{host}:{policy.kv_cache.compaction_sidecar_port}"


def vllm_plugin_env() -> list[dict[str, str]]:
    """Environment of the vLLM container that activates the plugin and its control socket.

    ``PYTHONPATH`` makes the copied gpupool tree importable and its entry point visible
    (``importlib.metadata`` scans every ``sys.path`` entry). The plugin renames block ids in
    the V1 model runner's tables; vLLM 0.32 picks Model Runner V2 by default when Triton is
    present (GPUs), so the V1 runner is requested."""
    return [
        {"name": "PYTHONPATH", "value": PLUGIN_TREE},
        {"name": ENABLE_ENV, "value": "1"},
        {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"},
        {"name": SOCKET_ENV, "value": SOCKET_PATH},
        {"name": TOKEN_FILE_ENV, "value": TOKEN_PATH},
    ]


def control_mounts() -> list[dict[str, Any]]:
    """Mounts both containers need: the control socket's directory and the token."""
    return [
        {"name": CONTROL_VOLUME, "mountPath": CONTROL_DIR},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]


def vllm_plugin_mounts() -> list[dict[str, Any]]:
    """Volume mounts the vLLM container needs: the control socket, its token, the plugin."""
    return [
        *control_mounts(),
        {"name": PLUGIN_VOLUME, "mountPath": PLUGIN_TREE, "readOnly": True},
    ]


def plugin_installer(policy: PoolPolicy) -> dict[str, Any]:
    """initContainer copying gpupool's tree from the sidecar's image into the plugin volume.

    The plugin and the sidecar come from the same image, so both ends of the control socket
    are always the same gpupool version."""
    return {
        "name": "gpupool-plugin",
        "image": policy.cluster.runtime_image,
        "command": ["cp", "-R", f"{PLUGIN_TREE}/.", PLUGIN_STAGING],
        "volumeMounts": [{"name": PLUGIN_VOLUME, "mountPath": PLUGIN_STAGING}],
        "resources": {
            "requests": {"cpu": "50m", "memory": "32Mi"},
            "limits": {"cpu": "250m", "memory": "64Mi"},
        },
        "securityContext": container_security(),
    }


def compaction_volumes(policy: PoolPolicy, workload: FlexWorkload) -> list[dict[str, Any]]:
    """Pod volumes: the socket directory (memory), the token Secret, the policy ConfigMap,
    the plugin tree (filled by ``plugin_installer``), the shared compaction token (optional:
    without it the sidecar takes compaction requests with its own token only)."""
    return [
        {"name": CONTROL_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {
            "name": TOKEN_VOLUME,
            "secret": {"secretName": token_secret_name(workload), "defaultMode": 0o400},
        },
        {"name": POLICY_VOLUME, "configMap": {"name": POLICY_CONFIGMAP}},
        {"name": PLUGIN_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        {
            "name": COMPACTION_TOKEN_VOLUME,
            "secret": {
                "secretName": policy.tuner.compaction_token_secret,
                "defaultMode": 0o400,
                "optional": True,
            },
        },
    ]


def metrics_endpoint(port: int) -> dict[str, Any]:
    """A KV sidecar's ``kv-metrics`` port and its probe: liveness only, because a sidecar that
    is not ready must never take the pod out of its Service."""
    return {
        "ports": [{"name": METRICS_PORT, "containerPort": port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": METRICS_PORT},
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


def compaction_sidecar(policy: PoolPolicy, workload: FlexWorkload) -> dict[str, Any]:
    """Container spec of the compaction sidecar in ``workload``'s pod."""
    kv = policy.kv_cache
    return {
        "name": "kv-compaction",
        "image": policy.cluster.runtime_image,
        "command": ["gpupool", "kv-sidecar", "run"],
        "args": [
            "--policy",
            f"{POLICY_DIR}/{POLICY_FILE}",
            "--metrics-url",
            f"http://127.0.0.1:{workload.port}/metrics",
            "--socket",
            SOCKET_PATH,
            "--token-file",
            TOKEN_PATH,
            "--listen",
            f"0.0.0.0:{kv.compaction_sidecar_port}",
            "--workload",
            workload.name,
            "--compaction-token-file",
            f"{COMPACTION_TOKEN_DIR}/{policy.tuner.compaction_token_key}",
        ],
        **metrics_endpoint(kv.compaction_sidecar_port),
        "volumeMounts": [
            *control_mounts(),
            {"name": POLICY_VOLUME, "mountPath": POLICY_DIR, "readOnly": True},
            {"name": COMPACTION_TOKEN_VOLUME, "mountPath": COMPACTION_TOKEN_DIR, "readOnly": True},
        ],
        "resources": {
            "requests": {"cpu": "50m", "memory": "96Mi"},
            "limits": {"cpu": "250m", "memory": "192Mi"},
        },
        "securityContext": container_security(),
    }
