"""One flex vLLM workload: Deployment, snapshot PVC, Service, PodDisruptionBudget and HPA
(and, with ``model_cache.storage_class``, the shared model-cache PVC).

The HPA scales on ``catalogue.HPA_METRIC`` (``gpupool_flex_gpu_budget``), an External metric
that prometheus-adapter serves from the recording rule ``catalogue.FLEX_GPU_BUDGET``
(``gpupool:flex_gpu_budget``, label ``catalogue.BUDGET_LABEL``); its value is the number of
GPUs the workload may occupy right now. With an ``AverageValue`` target of
``gpus_per_replica`` the HPA's desired replica count is ``ceil(budget / gpus_per_replica)``,
clamped to the workload's replica bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from infra.builders.compaction_sidecar import (
    METRICS_PORT,
    compaction_service_name,
    compaction_sidecar,
    compaction_volumes,
    plugin_installer,
    vllm_plugin_env,
    vllm_plugin_mounts,
)
from infra.builders.meta import PART_OF, Manifest, metadata, selector_labels
from infra.builders.nodepools import GPU_RESOURCE, TAINT_EFFECT, Target
from infra.builders.pod import container_security, pod_security, pull_secrets
from infra.builders.rbac import FLEX_SERVICE_ACCOUNT
from infra.builders.snapshot_gc import (
    preserving,
    snapshot_claim_name,
    snapshot_gc,
    snapshot_volumes,
    vllm_snapshot_env,
    vllm_snapshot_mounts,
)
from policy import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.metrics import catalogue

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

COMPONENT = "flex-inference"
"""``app.kubernetes.io/component`` of every flex workload object."""

HOSTNAME_KEY = "kubernetes.io/hostname"
"""Node label naming the node: the topology of packing and of ``anti_affinity: required``."""

ZONE_KEY = "topology.kubernetes.io/zone"
"""Node label naming the failure domain: the topology a workload's replicas spread over."""

PREFER_OWN_POOL_WEIGHT = 100
"""Weight of the preferred node affinity on the workload's own flex pool (the largest)."""

PACK_WEIGHT = 100
"""Weight of the preferred pod affinity toward nodes already running flex pods (the
largest): flex fills nodes that run flex before empty ones (docs/design/lending.md)."""

ZONE_SPREAD_WEIGHT = 50
"""Weight of the preferred anti-affinity among one workload's replicas per zone, half of
``PACK_WEIGHT``: a node already running F flex pods stays first until its zone holds 2F
more of the workload's replicas than another zone (docs/design/lending.md)."""

KARPENTER_INITIALIZED = "karpenter.sh/initialized"
"""Label Karpenter puts on a node it launched once the node is ready (GPUs registered).
No NodePool can promise it, so Karpenter never provisions a node for a term requiring it,
while kube-scheduler places pods on the nodes that carry it: flex pods reach a lending
pool's existing nodes only (``karpenter`` target, docs/design/lending.md)."""

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

HpaTolerance = Literal["cluster", "behavior"]
"""Who sets the flex HPAs' tolerance (stack option ``gpupool:hpaTolerance``). ``cluster``: the
controller's ``--horizontal-pod-autoscaler-tolerance`` (10 % by default; every budget step is
sized to pass it, but growth by less than 10 % of the replicas is swallowed). ``behavior``:
``behavior.scaleUp/scaleDown.tolerance: 0`` on each HPA, so every step is taken, the last
replicas of a pool included; needs Kubernetes >= 1.33 with the ``HPAConfigurableTolerance``
feature gate (alpha in 1.33)."""

HPA_TOLERANCES: tuple[HpaTolerance, ...] = ("cluster", "behavior")

BEHAVIOR_TOLERANCE = "0"
"""``tolerance`` of both directions under ``behavior``: the budget is a whole number of GPUs,
so any difference from the current replicas is a decision, never noise."""

RATE_PERIOD_S = 60
"""HPA policy period: the policy's ``*_pods_per_minute`` limits are per 60 s."""

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


def flex_workload(
    policy: PoolPolicy,
    workload: FlexWorkload,
    vllm_args: Sequence[str],
    hpa_tolerance: HpaTolerance = "cluster",
    pod_labels: Mapping[str, str] | None = None,
    target: Target = "labels",
) -> list[Manifest]:
    """Every object of one flex workload, in apply order; ``pod_labels`` join its pods to
    the serving layer's pools (``infra.builders.serving.flex_pod_labels``); ``target`` is
    the stack's node-pool target (``flex_node_affinity``)."""
    compaction = [compaction_service(policy, workload)] if workload.kv_compaction else []
    cache = [model_cache_claim(policy, workload)] if workload.model_cache.storage_class else []
    snapshots = [snapshot_claim(policy, workload)] if preserving(policy) else []
    return [
        *snapshots,
        *cache,
        deployment(policy, workload, vllm_args, pod_labels, target),
        service(policy, workload),
        *compaction,
        disruption_budget(policy, workload),
        autoscaler(policy, workload, hpa_tolerance),
    ]


def _meta(policy: PoolPolicy, name: str, workload: FlexWorkload) -> Manifest:
    return metadata(
        name, COMPONENT, namespace=policy.cluster.flex_namespace, instance=workload.name
    )


def snapshot_claim(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """Shared volume for KV snapshots, so a replacement replica can restore its prefix cache."""
    volume = workload.snapshot_volume
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(policy, snapshot_claim_name(workload), workload),
        "spec": {
            "accessModes": [volume.access_mode],
            "storageClassName": volume.storage_class,
            "resources": {"requests": {"storage": volume.size}},
        },
    }


def model_cache_claim(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """ReadWriteMany volume for ``HF_HOME`` that every replica shares: a replica that
    replaces an evicted one loads the weights from it instead of downloading them again."""
    cache = workload.model_cache
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(policy, model_cache_claim_name(workload), workload),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cache.storage_class,
            "resources": {"requests": {"storage": cache.size}},
        },
    }


def _volumes(workload: FlexWorkload) -> list[Manifest]:
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


def flex_tolerations(policy: PoolPolicy, workload: FlexWorkload) -> list[Manifest]:
    """The pool taint of every tainted pool ``workload`` may use (its flex pool, then each
    pool that lends), then the common ``nvidia.com/gpu`` taint."""
    return [
        *(
            {
                "key": policy.cluster.pool_label,
                "operator": "Equal",
                "value": pool.name,
                "effect": TAINT_EFFECT,
            }
            for pool in policy.pools_for(workload)
            if pool.taint
        ),
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": TAINT_EFFECT},
    ]


def _pool_term(policy: PoolPolicy, pools: Sequence[str], *more: Manifest) -> Manifest:
    expression = {"key": policy.cluster.pool_label, "operator": "In", "values": list(pools)}
    return {"matchExpressions": [expression, *more]}


def flex_node_affinity(policy: PoolPolicy, workload: FlexWorkload, target: Target) -> Manifest:
    """Required: one of the pools ``workload`` may use (``PoolPolicy.pools_for``); preferred,
    weight 100, its own flex pool when another pool lends.

    On the ``karpenter`` target the lending pools are a second ``nodeSelectorTerm`` that
    also requires ``KARPENTER_INITIALIZED``: kube-scheduler ORs the terms, so flex lands on
    the lending pools' running nodes, but no NodePool can satisfy that term, so a pending
    flex pod makes Karpenter provision its flex pool (the first term) and never a
    production node (docs/design/lending.md, "Karpenter").
    """
    own = policy.pool_of(workload).name
    lending = [p.name for p in policy.pools_for(workload) if p.name != own]
    if not lending:
        return {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [_pool_term(policy, [own])]
            }
        }
    if target == "karpenter":
        ready = {"key": KARPENTER_INITIALIZED, "operator": "In", "values": ["true"]}
        terms = [_pool_term(policy, [own]), _pool_term(policy, lending, ready)]
    else:
        terms = [_pool_term(policy, [own, *lending])]
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": PREFER_OWN_POOL_WEIGHT, "preference": _pool_term(policy, [own])}
        ],
    }


def flex_pod_affinity() -> Manifest:
    """Preferred (``PACK_WEIGHT``): a node already running pods of any flex workload, so
    flex packs onto few nodes and what it gives back is whole free nodes. The term selects
    pods in the pod's own namespace, ``cluster.flex_namespace``, where every flex pod runs."""
    flex = {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": COMPONENT}
    term = {"labelSelector": {"matchLabels": flex}, "topologyKey": HOSTNAME_KEY}
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": PACK_WEIGHT, "podAffinityTerm": term}
        ]
    }


def deployment(
    policy: PoolPolicy,
    workload: FlexWorkload,
    vllm_args: Sequence[str],
    pod_labels: Mapping[str, str] | None = None,
    target: Target = "labels",
) -> Manifest:
    """The vLLM Deployment: lowest priority, on its flex pool or a pool that lends (the flex
    pool preferred), packed onto nodes that run flex, spread over zones, drained on eviction.

    ``replicas`` is left out: the HPA owns it, and a rendered value would fight the HPA on
    every sync. With ``workload.kv_compaction`` the pod also gets the plugin's initContainer,
    the compaction sidecar and their volumes (``infra.builders.compaction_sidecar``).
    """
    selector = selector_labels(workload.name)
    pod_meta = _meta(policy, workload.name, workload)
    pod_meta["labels"] |= {**(pod_labels or {}), **selector}
    del pod_meta["name"], pod_meta["namespace"]
    containers = [_vllm_container(policy, workload, vllm_args)]
    volumes = _volumes(workload)
    compaction: Manifest = {}
    if workload.kv_compaction:
        containers.append(compaction_sidecar(policy, workload))
        volumes += compaction_volumes(policy, workload)
        compaction["initContainers"] = [plugin_installer(policy)]
    elif preserving(policy):
        containers.append(snapshot_gc(policy, workload))
        volumes += snapshot_volumes(workload)
        compaction["initContainers"] = [plugin_installer(policy)]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "selector": {"matchLabels": selector},
            # A surge replica would need a free GPU; replace one at a time instead.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "priorityClassName": policy.priorities.idle_inference.name,
                    "serviceAccountName": FLEX_SERVICE_ACCOUNT,
                    # neither vLLM nor the sidecar calls the Kubernetes API
                    "automountServiceAccountToken": False,
                    **pull_secrets(policy),
                    "tolerations": flex_tolerations(policy, workload),
                    "affinity": {
                        "nodeAffinity": flex_node_affinity(policy, workload, target),
                        "podAffinity": flex_pod_affinity(),
                        "podAntiAffinity": _anti_affinity(policy, selector),
                    },
                    "terminationGracePeriodSeconds": policy.disruption.termination_grace_s,
                    "securityContext": pod_security(),
                    **compaction,
                    "containers": containers,
                    "volumes": volumes,
                },
            },
        },
    }


def _hash_seed_env(policy: PoolPolicy) -> list[Manifest]:
    """``PYTHONHASHSEED``: seeds vLLM's prefix hashes, which name the snapshot files."""
    seed = policy.kv_cache.python_hash_seed
    return [] if seed is None else [{"name": "PYTHONHASHSEED", "value": str(seed)}]


def _anti_affinity(policy: PoolPolicy, selector: dict[str, str]) -> Manifest:
    """Preferred (``ZONE_SPREAD_WEIGHT``): the workload's replicas over zones. With
    ``disruption.anti_affinity: required`` also at most one replica per node."""
    zone = {"labelSelector": {"matchLabels": selector}, "topologyKey": ZONE_KEY}
    out: Manifest = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": ZONE_SPREAD_WEIGHT, "podAffinityTerm": zone}
        ]
    }
    if policy.disruption.anti_affinity == "required":
        node = {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_KEY}
        out["requiredDuringSchedulingIgnoredDuringExecution"] = [node]
    return out


def _vllm_container(
    policy: PoolPolicy, workload: FlexWorkload, vllm_args: Sequence[str]
) -> Manifest:
    limits = {
        "cpu": workload.resources.cpu,
        "memory": workload.resources.memory,
        GPU_RESOURCE: str(workload.gpus_per_replica),
    }
    probe = {"httpGet": {"path": HEALTH_PATH, "port": HTTP_PORT}}
    disruption = policy.disruption
    plugin = workload.kv_compaction
    container: Manifest = {
        "name": "vllm",
        "image": workload.image,
        "command": list(VLLM_COMMAND),
        "args": list(vllm_args),
        "ports": [{"name": HTTP_PORT, "containerPort": workload.port, "protocol": "TCP"}],
        "env": [
            {"name": "HOME", "value": CACHE_MOUNT_PATH},
            {"name": "HF_HOME", "value": f"{MODEL_CACHE_PATH}/huggingface"},
            *(
                [{"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"}]
                if workload.hf_token_secret is not None
                else []
            ),
            *(vllm_plugin_env() if plugin else []),
            *(vllm_snapshot_env() if preserving(policy) else []),
            *_hash_seed_env(policy),
        ],
        "resources": {"requests": dict(limits), "limits": limits},
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
        # writes go to the volumes below only: HOME, HF_HOME, /tmp, /dev/shm, snapshots
        "securityContext": container_security(),
        "volumeMounts": [
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
            *(vllm_plugin_mounts() if plugin else []),
        ],
    }
    # Readiness fails first, routing drops the pod while vLLM still serves, then SIGTERM:
    # vLLM drains in-flight requests for drain_s (docs/serving.md, "The shutdown order").
    container["lifecycle"] = {
        "postStart": {"exec": {"command": poststart_command()}},
        "preStop": {"exec": {"command": prestop_command(disruption.prestop_delay_s)}},
    }
    return container


def service(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """ClusterIP Service in front of the replicas (the router sends flex traffic here)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(workload.name),
            "ports": [
                {
                    "name": HTTP_PORT,
                    "port": workload.port,
                    "targetPort": HTTP_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def compaction_service(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """Headless Service on the sidecars' port: its DNS name resolves to every ready pod, so
    the tuner can post a compaction request to each without RBAC to list pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(policy, compaction_service_name(workload), workload),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(workload.name),
            "ports": [
                {
                    "name": METRICS_PORT,
                    "port": policy.kv_cache.compaction_sidecar_port,
                    "targetPort": METRICS_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def disruption_budget(policy: PoolPolicy, workload: FlexWorkload) -> Manifest:
    """PDB: voluntary evictions (drains, Karpenter consolidation) keep ``minAvailable`` up.

    Preemption by higher-priority pods ignores PDBs by design: that is how flex yields.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "minAvailable": policy.disruption.pdb_min_available,
            "selector": {"matchLabels": selector_labels(workload.name)},
            # A crash-looping replica must not block node drains.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def autoscaler(
    policy: PoolPolicy, workload: FlexWorkload, tolerance: HpaTolerance = "cluster"
) -> Manifest:
    """autoscaling/v2 HPA on the GPU budget, with the policy's stabilization windows."""
    scaling = policy.autoscaling
    per_hpa = {"tolerance": BEHAVIOR_TOLERANCE} if tolerance == "behavior" else {}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(policy, workload.name, workload),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": workload.name,
            },
            "minReplicas": workload.min_replicas,
            "maxReplicas": policy.replica_bound(workload),
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": catalogue.HPA_METRIC,
                            "selector": {"matchLabels": {catalogue.BUDGET_LABEL: workload.name}},
                        },
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(workload.gpus_per_replica),
                        },
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    **per_hpa,
                    "stabilizationWindowSeconds": scaling.scale_up_stabilization_s,
                    "selectPolicy": "Max",
                    "policies": [
                        {
                            "type": "Pods",
                            "value": scaling.scale_up_pods_per_minute,
                            "periodSeconds": RATE_PERIOD_S,
                        }
                    ],
                },
                "scaleDown": {
                    **per_hpa,
                    "stabilizationWindowSeconds": scaling.scale_down_stabilization_s,
                    "selectPolicy": "Max",
                    "policies": [
                        {
                            "type": "Pods",
                            "value": scaling.scale_down_pods_per_minute,
                            "periodSeconds": RATE_PERIOD_S,
                        }
                    ],
                },
            },
        },
    }
