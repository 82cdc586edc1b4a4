"""The flex pod's vLLM container: its command, environment, probes, drain hooks, volumes
and mounts (the Deployment around it is ``infra.builders.workload``)."""

from __future__ import annotations

from collections.abc import Sequence

from infra.builders.compaction_sidecar import vllm_plugin_env, vllm_plugin_mounts
from infra.builders.meta import Manifest
from infra.builders.nodepools import GPU_RESOURCE
from infra.builders.pod import container_security
from infra.builders.snapshot_gc import preserving, vllm_snapshot_env, vllm_snapshot_mounts
from policy import PoolPolicy
from policy.workloads import FlexWorkload

CACHE_MOUNT_PATH = "/var/lib/gpupool/cache"
"""Writable ``HOME`` of the vLLM container: compiler and kernel caches (torch.compile, Triton,
FlashInfer), per pod. The root filesystem is read-only."""

CACHE_SIZE_LIMIT = "16Gi"
"""``sizeLimit`` of that ``emptyDir``: compile caches are hundreds of MB; a runaway writer is
evicted instead of filling the node's disk."""

MODEL_CACHE_PATH = "/var/lib/gpupool/models"
"""Mount point of the model cache (``workloads[].model_cache``); ``HF_HOME`` is below it."""

TMP_SIZE_LIMIT = "4Gi"
"""``sizeLimit`` of the vLLM container's ``/tmp`` (an ``emptyDir``, the root is read-only)."""

HF_TOKEN_DIR = "/etc/gpupool/hf-token"
"""Where ``hf_token_secret`` is mounted; ``HF_TOKEN_PATH`` names its ``token`` file
(huggingface_hub reads the token from that file when ``HF_TOKEN`` is unset)."""

HF_TOKEN_KEY = "token"
"""Key of the Hugging Face token inside ``hf_token_secret``."""

VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
"""Entry point of the OpenAI-compatible server; the args come from ``runtime.vllm``."""

HEALTH_PATH = "/health"
"""vLLM's health endpoint: 200 once the engine serves, 5xx when the engine died."""

HTTP_PORT = "http"
"""Name of the vLLM container port (OpenAI API, ``/health``, ``/metrics``)."""

DRAIN_VOLUME = "drain"
"""The ``emptyDir`` holding the drain marker (the root filesystem is read-only)."""

DRAIN_DIR = "/var/run/gpupool/drain"
"""Where the vLLM container mounts it."""

DRAIN_MARKER = f"{DRAIN_DIR}/draining"
"""Written by the preStop hook; while it exists the readiness probe fails, so the pod turns
unready (EndpointSlice ``serving: false``, the endpoint picker's Ready check) before vLLM gets
SIGTERM. The kubelet also runs preStop before restarting a container whose liveness probe
failed, and an ``emptyDir`` outlives container restarts, so the postStart hook removes the
marker: the kubelet starts probing only after postStart returned."""

DRAIN_SIZE_LIMIT = "1Mi"
"""``sizeLimit`` of the marker's ``emptyDir`` (memory-backed: one empty file)."""

HEALTH_CHECK_PY = (
    "import _socket as n,sys;a=sys.argv;c=n.socket(n.AF_INET,n.SOCK_STREAM);"
    "c.settimeout(float(a[3]));c.connect((a[1],int(a[2])));"
    f'c.sendall(b"GET {HEALTH_PATH} HTTP/1.1\\r\\nHost: localhost\\r\\n'
    'Connection: close\\r\\n\\r\\n");'
    'r=b"".join(iter(lambda:c.recv(4096),b""));'
    'sys.exit(not(r[:5]==b"HTTP/" and r[9:10]==b"2"))'
)
"""The readiness probe's HTTP check, in the image's own python3 (the vLLM image has python3 and
sh; curl and wget are not guaranteed): exits 0 on a 2xx status line from ``/health``,
non-zero otherwise (refused connections and timeouts raise). One raw HTTP/1.1 request on the
interpreter's built-in ``_socket`` rather than ``urllib`` or ``socket``: the probe runs every
second on every flex pod, and importing ``urllib.request`` costs ~6x the interpreter's
start in CPU, ``socket`` ~2x, ``_socket`` nearly nothing (bench/readiness_probe.py,
docs/benchmarks.md)."""

LIVENESS_PERIOD_S = 10
"""How often liveness is probed."""

LIVENESS_FAILURES = 3
"""Failed liveness probes before the kubelet restarts a hung engine."""

STARTUP_PERIOD_S = 10
"""Startup probe period; ``startup_timeout_s`` / this many failures are allowed."""


def prestop_command(delay_s: int) -> list[str]:
    """The vLLM container's preStop hook: write the drain marker (readiness fails from the
    next probe on), then sleep ``delay_s`` while routing drops the pod; the kubelet sends
    SIGTERM when the hook returns. A failed write still sleeps: the pod then leaves routing
    on its deletion alone, as before the marker existed."""
    return ["sh", "-c", f": > {DRAIN_MARKER}; exec sleep {delay_s}"]


def poststart_command() -> list[str]:
    """The vLLM container's postStart hook: remove a drain marker left by the preStop of a
    previous container of this pod (a liveness restart), which would keep it unready."""
    return ["sh", "-c", f"rm -f {DRAIN_MARKER}"]


def readiness_command(port: int, timeout_s: int) -> list[str]:
    """The readiness probe: fail at once while the drain marker exists (no HTTP call, so a
    draining pod turns unready within ``failureThreshold`` periods), otherwise ask vLLM's
    ``/health`` on ``port``. An exec probe rather than ``httpGet``: an HTTP probe cannot see
    the marker, and the alternative, a readiness endpoint served by a gpupool container, would
    need a sidecar in every pod (gpupool's sidecars run only with compaction or preservation)
    and a second process whose failure takes a healthy vLLM out of routing. ``python3 -I -S``
    skips the image's site packages and environment: the interpreter's built-in ``_socket``
    is all it needs (``HEALTH_CHECK_PY``)."""
    check = f"exec python3 -I -S -c '{HEALTH_CHECK_PY}' 127.0.0.1 {port} {timeout_s}"
    return ["sh", "-c", f"test ! -e {DRAIN_MARKER} && {check}"]


def model_cache_claim_name(workload: FlexWorkload) -> str:
    """Name of the workload's shared model-cache PersistentVolumeClaim."""
    return f"{workload.name}-model-cache"


def vllm_volumes(workload: FlexWorkload) -> list[Manifest]:
    """The vLLM container's volumes (the compaction sidecar and the snapshot GC add theirs)."""
    models: Manifest = (
        {"persistentVolumeClaim": {"claimName": model_cache_claim_name(workload)}}
        if workload.model_cache.storage_class
        else {"emptyDir": {"sizeLimit": workload.model_cache.size}}
    )
    volumes: list[Manifest] = [
        {"name": "cache", "emptyDir": {"sizeLimit": CACHE_SIZE_LIMIT}},
        {"name": "models", **models},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
        # NCCL and vLLM's tensor-parallel workers share memory through /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": DRAIN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": DRAIN_SIZE_LIMIT}},
    ]
    if workload.hf_token_secret is not None:
        volumes.append(
            {
                "name": "hf-token",
                "secret": {"secretName": workload.hf_token_secret, "defaultMode": 0o440},
            }
        )
    return volumes


def _hash_seed_env(policy: PoolPolicy) -> list[Manifest]:
    """``PYTHONHASHSEED``: seeds vLLM's prefix hashes, which name the snapshot files."""
    seed = policy.kv_cache.python_hash_seed
    return [] if seed is None else [{"name": "PYTHONHASHSEED", "value": str(seed)}]


def vllm_container(
    policy: PoolPolicy, workload: FlexWorkload, vllm_args: Sequence[str]
) -> Manifest:
    """The container that serves the model: ``vllm_args`` from ``runtime.vllm``, the GPUs
    of one replica, probes on ``/health`` and the drain marker, writes to volumes only."""
    limits = {
        "cpu": workload.resources.cpu,
        "memory": workload.resources.memory,
        GPU_RESOURCE: str(workload.gpus_per_replica),
    }
    disruption = policy.disruption
    return {
        "name": "vllm",
        "image": workload.image,
        "command": list(VLLM_COMMAND),
        "args": list(vllm_args),
        "ports": [{"name": HTTP_PORT, "containerPort": workload.port, "protocol": "TCP"}],
        "env": _vllm_env(policy, workload),
        "resources": {"requests": dict(limits), "limits": limits},
        **_vllm_probes(policy, workload),
        # writes go to the volumes below only: HOME, HF_HOME, /tmp, /dev/shm, snapshots
        "securityContext": container_security(),
        "volumeMounts": _vllm_mounts(policy, workload),
        # Readiness fails first, routing drops the pod while vLLM still serves, then SIGTERM:
        # vLLM drains in-flight requests for drain_s (docs/serving.md, "The shutdown order").
        "lifecycle": {
            "postStart": {"exec": {"command": poststart_command()}},
            "preStop": {"exec": {"command": prestop_command(disruption.prestop_delay_s)}},
        },
    }


def _vllm_env(policy: PoolPolicy, workload: FlexWorkload) -> list[Manifest]:
    """Writable caches, the model cache, the token file, and what the plugin and the
    snapshot tier read."""
    return [
        {"name": "HOME", "value": CACHE_MOUNT_PATH},
        {"name": "HF_HOME", "value": f"{MODEL_CACHE_PATH}/huggingface"},
        *(
            [{"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"}]
            if workload.hf_token_secret is not None
            else []
        ),
        *(vllm_plugin_env() if workload.kv_compaction else []),
        *(vllm_snapshot_env() if preserving(policy) else []),
        *_hash_seed_env(policy),
    ]


def _vllm_probes(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """Startup (the model load, up to ``startup_timeout_s``), readiness (the drain marker,
    then ``/health``) and liveness (a hung engine is restarted)."""
    probe = {"httpGet": {"path": HEALTH_PATH, "port": HTTP_PORT}}
    disruption = policy.disruption
    return {
        "startupProbe": probe
        | {
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": -(-workload.startup_timeout_s // STARTUP_PERIOD_S),
        },
        "readinessProbe": {
            "exec": {"command": readiness_command(workload.port, disruption.readiness_period_s)},
            "periodSeconds": disruption.readiness_period_s,
            "timeoutSeconds": disruption.readiness_period_s,
            "failureThreshold": disruption.readiness_failure_threshold,
        },
        "livenessProbe": probe
        | {"periodSeconds": LIVENESS_PERIOD_S, "failureThreshold": LIVENESS_FAILURES},
    }


def _vllm_mounts(policy: PoolPolicy, workload: FlexWorkload) -> list[Manifest]:
    """Where ``vllm_volumes`` (and the snapshot and plugin volumes) appear in the container."""
    return [
        *(vllm_snapshot_mounts(workload) if preserving(policy) else []),
        {"name": "cache", "mountPath": CACHE_MOUNT_PATH},
        {"name": "models", "mountPath": MODEL_CACHE_PATH},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": DRAIN_VOLUME, "mountPath": DRAIN_DIR},
        *(
            [{"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True}]
            if workload.hf_token_secret is not None
            else []
        ),
        *(vllm_plugin_mounts() if workload.kv_compaction else []),
    ]
