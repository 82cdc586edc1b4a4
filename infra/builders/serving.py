"""The serving layer (``policy.serving``): which requests reach which instances.

Two renderings, chosen by the stack option ``gpupool:serving`` (docs/serving.md):

- ``inference-extension``: the Gateway API Inference Extension. Per served model and tier (the
  flex pods in the flex namespace, the owner's production pods in their namespace: an
  InferencePool selects pods of its own namespace only) one InferencePool over those pods,
  its endpoint picker (ConfigMap, Deployment, Service, RBAC, NetworkPolicy), one
  InferenceObjective per traffic class that tier serves, and an HTTPRoute on the policy's
  Gateway whose rules send each objective's requests to the pool;
- ``services``: plain Kubernetes for clusters without an inference-capable Gateway: one Service
  per model and traffic class over the pods that may serve it.

The endpoint picker's configuration (``endpoint_picker_config``) is generated from the policy:
scorers on queue depth, KV-cache utilization and prefix-cache affinity, and the saturation
detector's thresholds from the fields that already mean them (``kv_cache.page_table_max_usage``,
``serving.endpoint_picker.queue_depth_max``). Which InferenceObjective API group (and so which
endpoint picker distribution) is emitted is the stack option ``gpupool:inferenceObjectiveApi``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from infra.builders.meta import Manifest, labels, metadata, selector_labels
from infra.builders.network import endpoint_picker_network_policy
from infra.builders.pod import container_security, pod_security, pull_secrets
from infra.builders.rbac import POOL_GROUP, endpoint_picker_rbac
from infra.builders.scraping import endpoint_picker_pod_monitor
from infra.yaml_text import to_yaml
from policy import PoolPolicy
from policy.serving import ServedModel, Serving, Tier, TrafficClass
from policy.workloads import FlexWorkload

ServingMode = Literal["inference-extension", "services", "off"]
"""Stack option ``gpupool:serving`` (``gpupool render --serving``): the Gateway API Inference
Extension, plain Services, or nothing. ``off`` is the default: a stack that upgrades gpupool
renders exactly what it did before, and the other two need components (CRDs, a Gateway) the
cluster may not have."""

SERVING_MODES: tuple[ServingMode, ...] = ("inference-extension", "services", "off")

ObjectiveApi = Literal["inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2"]
"""Stack option ``gpupool:inferenceObjectiveApi``: where InferenceObjective lives, which is
where the endpoint picker that reads it comes from: GIE up to v1.5
(``inference.networking.x-k8s.io``) or llm-d-router, where the picker moved (``llm-d.ai``)."""

OBJECTIVE_APIS: tuple[ObjectiveApi, ...] = (
    "inference.networking.x-k8s.io/v1alpha2",
    "llm-d.ai/v1alpha2",
)


@dataclass(frozen=True)
class ServingOptions:
    """The stack's serving options (docs/serving.md "Stack options")."""

    mode: ServingMode = "off"
    objective_api: ObjectiveApi = "llm-d.ai/v1alpha2"


DEFAULT_SERVING = ServingOptions()
"""The options of a stack that sets neither: nothing is rendered for serving."""


@dataclass(frozen=True)
class Distribution:
    """What one endpoint picker distribution reads and needs."""

    config_api: str
    """``apiVersion`` of its EndpointPickerConfig."""
    objective_groups: tuple[str, ...]
    """API groups in which it watches InferenceObjectives (its Role reads them)."""
    image_field: str
    """The field of ``serving.endpoint_picker.images`` that names its image."""
    objective_headers: tuple[str, ...]
    """Request headers naming the objective that it reads; the route sets them all to one
    value, so a request names one class."""


OBJECTIVE_HEADER = "x-gateway-inference-objective"
"""The header clients name their InferenceObjective in (read by both distributions)."""

DISTRIBUTIONS: dict[ObjectiveApi, Distribution] = {
    "inference.networking.x-k8s.io/v1alpha2": Distribution(
        config_api="inference.networking.x-k8s.io/v1alpha1",
        objective_groups=("inference.networking.x-k8s.io",),
        image_field="gie",
        objective_headers=(OBJECTIVE_HEADER,),
    ),
    # llm-d-router also reads the old group and header (its chart's Role grants both).
    "llm-d.ai/v1alpha2": Distribution(
        config_api="llm-d.ai/v1alpha1",
        objective_groups=("llm-d.ai", "inference.networking.x-k8s.io"),
        image_field="llm_d_router",
        objective_headers=(OBJECTIVE_HEADER, "x-llm-d-inference-objective"),
    ),
}

RETRY_AFTER = "Retry-After"
"""Response header the sheddable classes' routes set with ``serving.retry_after_s``."""

COMPONENT = "serving"
"""``app.kubernetes.io/component`` of the serving objects."""

MODEL_LABEL = "gpupool.io/model"
"""Pod label of the flex pods of a served model (value: ``serving.models[].name``); the flex
pool selects it. Production pods are selected by their own labels (``pod_labels``)."""

POOL_API = f"{POOL_GROUP}/v1"
ROUTE_GROUP = "gateway.networking.k8s.io"
ROUTE_API = f"{ROUTE_GROUP}/v1"

GRPC_PORT, HEALTH_PORT, METRICS_PORT = 9002, 9003, 9090
"""The endpoint picker's ext_proc, gRPC health and metrics ports (its defaults)."""
GRPC, HEALTH, METRICS = "grpc", "grpc-health", "metrics"
"""Their container port names."""
HEALTH_SERVICE = "inference-extension"
"""gRPC health service of a single-replica picker (``liveness``/``readiness`` are for leader
election, which one replica does not use)."""
CONFIG_DIR, CONFIG_FILE = "/config", "config.yaml"
"""Where the picker reads its EndpointPickerConfig."""
PROBE_PERIOD_S = 5
"""Period of the picker's probes."""
TMP_SIZE_LIMIT = "1Gi"
"""``sizeLimit`` of the picker's ``/tmp`` (its root filesystem is read-only)."""

PROFILE_HANDLER, PICKER, DETECTOR = (
    "single-profile-handler",
    "max-score-picker",
    "utilization-detector",
)
"""The plugins every configuration names: one profile, the best score wins, and the detector
on queue depth and KV usage that decides when sheddable requests are refused."""


class ServingProblem(ValueError):
    """The policy cannot be served in the stack's serving mode (``serving_problems`` says
    why; ``infra.inputs.load_inputs`` reports the same at the policy's lines first)."""


@dataclass(frozen=True)
class Pool:
    """The instances of one tier that serve one model, in one namespace."""

    name: str
    namespace: str
    tier: Tier
    model: ServedModel
    selector: dict[str, str]
    """Pod labels every member carries (the InferencePool's and the Services' selector)."""
    port: int
    """The members' serving port (InferencePool ``targetPorts``)."""
    classes: tuple[TrafficClass, ...]
    """The traffic classes this tier serves."""

    @property
    def picker(self) -> str:
        """Name of the pool's endpoint picker (Deployment, Service, ConfigMap, RBAC)."""
        return f"{self.name}-epp"


def served_model(policy: PoolPolicy, workload: FlexWorkload) -> ServedModel | None:
    """The served model ``workload`` is an instance of, if any."""
    serving = policy.serving
    models = serving.models if serving is not None else []
    return next((m for m in models if m.model == workload.model), None)


def flex_pod_labels(policy: PoolPolicy, workload: FlexWorkload) -> dict[str, str]:
    """The pod label that puts ``workload``'s pods in their model's flex pool (none if the
    model is not served)."""
    model = served_model(policy, workload)
    return {MODEL_LABEL: model.name} if model is not None else {}


def pools(policy: PoolPolicy) -> list[Pool]:
    """Every pool: per served model, its flex instances and its production instances, each
    where some traffic class is served by that tier (a pool nobody routes to is left out)."""
    serving = policy.serving
    if serving is None:
        return []
    out = []
    for model in serving.models:
        flex = [w for w in policy.workloads if w.model == model.model]
        members: list[tuple[Tier, str, dict[str, str], int]] = []
        if flex:
            ns = policy.cluster.flex_namespace
            members.append(("flex", ns, {MODEL_LABEL: model.name}, flex[0].port))
        if model.production is not None:
            prod = model.production
            members.append(("production", prod.namespace, dict(prod.pod_labels), prod.port))
        for tier, namespace, selector, port in members:
            classes = tuple(c for c in serving.traffic_classes if c.served_by == tier)
            if classes:
                name = f"{model.name}-{tier}"
                out.append(Pool(name, namespace, tier, model, selector, port, classes))
    return out


def endpoint_picker_config(policy: PoolPolicy, api: ObjectiveApi) -> dict[str, Any]:
    """The EndpointPickerConfig of every pool: the policy's scorer weights, and the
    saturation detector at the policy's thresholds (KV usage ``page_table_max_usage``)."""
    picker = _serving(policy).endpoint_picker
    scorers = [
        (plugin, weight)
        for plugin, weight in (
            ("queue-scorer", picker.queue_scorer_weight),
            ("kv-cache-utilization-scorer", picker.kv_cache_scorer_weight),
            ("prefix-cache-scorer", picker.prefix_cache_scorer_weight),
        )
        if weight > 0
    ]
    detector = {
        "queueDepthThreshold": picker.queue_depth_max,
        "kvCacheUtilThreshold": policy.kv_cache.page_table_max_usage,
        "metricsStalenessThreshold": f"{picker.metrics_staleness_ms}ms",
    }
    return {
        "apiVersion": DISTRIBUTIONS[api].config_api,
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": PROFILE_HANDLER},
            *({"type": plugin} for plugin, _ in scorers),
            {"type": PICKER},
            {"type": DETECTOR, "parameters": detector},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    *({"pluginRef": plugin, "weight": weight} for plugin, weight in scorers),
                    {"pluginRef": PICKER},
                ],
            }
        ],
        "saturationDetector": {"pluginRef": DETECTOR},
    }


NOT_CONFIGURED = (
    "the stack option gpupool:serving (gpupool render --serving) asks for a serving layer but "
    "the policy has no serving section; expected one (docs/serving.md) or serving off"
)


def serving_problems(policy: PoolPolicy, options: ServingOptions) -> list[tuple[str, str]]:
    """``(field path, message)`` for what keeps ``policy`` from being served in
    ``options.mode``: no ``serving`` section, or flex workloads of one model on different
    ports (a pool, and a class's Service, send to one port on every member). Nothing when
    off: these rules involve the workloads, so they cannot be policy invariants (the
    sidecars' policy ConfigMap drops the workloads and must still load)."""
    if options.mode == "off":
        return []
    if policy.serving is None:
        return [("serving", NOT_CONFIGURED)]
    found: list[tuple[str, str]] = []
    first: dict[str, tuple[str, int]] = {}
    for i, w in enumerate(policy.workloads):
        model = served_model(policy, w)
        if model is None:
            continue
        name, port = first.setdefault(model.name, (w.name, w.port))
        if port != w.port:
            found.append(
                (
                    f"workloads.{i}.port",
                    f"workload {w.name!r} serves model {model.name!r} on port {w.port} and "
                    f"workload {name!r} on {port}: a pool sends to one port on every member "
                    f"(InferencePool targetPorts); expected port {port}",
                )
            )
    return found


def _serving(policy: PoolPolicy) -> Serving:
    if policy.serving is None:
        raise ServingProblem(NOT_CONFIGURED)
    return policy.serving


def _meta(name: str, namespace: str) -> Manifest:
    return metadata(name, COMPONENT, namespace=namespace, instance=name)


def _picker_container(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> Manifest:
    """The picker's one container: its flags, ports, probes and mounts."""
    picker = _serving(policy).endpoint_picker
    limits = {"cpu": picker.resources.cpu, "memory": picker.resources.memory}
    args = [
        *("--pool-name", pool.name, "--pool-namespace", pool.namespace, "--pool-group", POOL_GROUP),
        *("--config-file", f"{CONFIG_DIR}/{CONFIG_FILE}"),
        *("--grpc-port", str(GRPC_PORT), "--grpc-health-port", str(HEALTH_PORT)),
        *("--metrics-port", str(METRICS_PORT)),
        # The NetworkPolicy admits only Prometheus to the metrics port; token review would
        # need a ClusterRole on tokenreviews and subjectaccessreviews.
        "--metrics-endpoint-auth=false",
    ]
    probe = {
        "grpc": {"port": HEALTH_PORT, "service": HEALTH_SERVICE},
        "periodSeconds": PROBE_PERIOD_S,
    }
    return {
        "name": "epp",
        "image": getattr(picker.images, DISTRIBUTIONS[api].image_field),
        "args": args,
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": port_name, "containerPort": number, "protocol": "TCP"}
            for port_name, number in (
                (GRPC, GRPC_PORT),
                (HEALTH, HEALTH_PORT),
                (METRICS, METRICS_PORT),
            )
        ],
        "readinessProbe": probe,
        "livenessProbe": probe,
        "resources": {"requests": dict(limits), "limits": limits},
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _picker_deployment(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> Manifest:
    """The picker's Deployment: one replica reading its ConfigMap."""
    name = pool.picker
    pods = selector_labels(name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, pool.namespace),
        "spec": {
            # One active picker: its prefix-cache index lives in memory (upstream runs one
            # replica, replaced with Recreate, unless leader election is set up).
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": pods},
            "template": {
                "metadata": {"labels": labels(COMPONENT, name) | pods},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,
                    **pull_secrets(policy),
                    # ext_proc streams last as long as their requests; flex pods drain theirs
                    # within the same budget
                    "terminationGracePeriodSeconds": policy.disruption.termination_grace_s,
                    "securityContext": pod_security(),
                    "containers": [_picker_container(policy, pool, api)],
                    "volumes": [
                        {"name": "config", "configMap": {"name": name}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
                    ],
                },
            },
        },
    }


def _picker_service(pool: Pool) -> Manifest:
    """The picker's Service: ext_proc for the Gateway, metrics for Prometheus."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool.picker, pool.namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(pool.picker),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": GRPC_PORT,
                    "targetPort": GRPC,
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {
                    "name": "http-metrics",
                    "port": METRICS_PORT,
                    "targetPort": METRICS,
                    "protocol": "TCP",
                },
            ],
        },
    }


def _picker_config(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> Manifest:
    """The ConfigMap holding the picker's EndpointPickerConfig."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool.picker, pool.namespace),
        "data": {CONFIG_FILE: to_yaml(endpoint_picker_config(policy, api), sort_keys=False)},
    }


def endpoint_picker(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> list[Manifest]:
    """The pool's picker: RBAC, configuration, Deployment, Service, NetworkPolicy and
    PodMonitor, in apply order."""
    name, ns, pods = pool.picker, pool.namespace, selector_labels(pool.picker)
    return [
        *endpoint_picker_rbac(name, ns, DISTRIBUTIONS[api].objective_groups),
        _picker_config(policy, pool, api),
        _picker_deployment(policy, pool, api),
        _picker_service(pool),
        endpoint_picker_network_policy(
            policy, ns, pods, (GRPC, METRICS), _serving(policy).gateway.namespace
        ),
        # its request, shed and poll-error counters feed the serving alerts (alerts/serving.py)
        endpoint_picker_pod_monitor(policy, pool.name, ns, pods, METRICS),
    ]


def inference_pool(policy: PoolPolicy, pool: Pool) -> Manifest:
    """The InferencePool: the pool's pods on their serving port, and its picker."""
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": _meta(pool.name, pool.namespace),
        "spec": {
            "selector": {"matchLabels": dict(pool.selector)},
            "targetPorts": [{"number": pool.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": pool.picker,
                "port": {"number": GRPC_PORT},
                "failureMode": _serving(policy).endpoint_picker.failure_mode,
            },
        },
    }


def inference_objectives(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> list[Manifest]:
    """One InferenceObjective per traffic class the pool serves: its priority, in the pool."""
    serving = _serving(policy)
    return [
        {
            "apiVersion": api,
            "kind": "InferenceObjective",
            "metadata": _meta(serving.objective_name(pool.model, c), pool.namespace),
            "spec": {
                "priority": c.priority,
                "poolRef": {"group": POOL_GROUP, "kind": "InferencePool", "name": pool.name},
            },
        }
        for c in pool.classes
    ]


def http_route(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> Manifest:
    """The route from the Gateway to the pool: one rule per objective, matching the header
    clients name it in and setting every objective header the picker reads to that value."""
    serving = _serving(policy)
    gateway = serving.gateway
    parent = {
        "group": ROUTE_GROUP,
        "kind": "Gateway",
        "name": gateway.name,
        "namespace": gateway.namespace,
    }
    if gateway.section_name is not None:
        parent["sectionName"] = gateway.section_name
    rules = []
    for c in pool.classes:
        objective = serving.objective_name(pool.model, c)
        header = {"type": "Exact", "name": OBJECTIVE_HEADER, "value": objective}
        headers = [{"name": h, "value": objective} for h in DISTRIBUTIONS[api].objective_headers]
        filters: list[Manifest] = [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": headers}}
        ]
        if serving.retry_after_s is not None and c.sheddable:
            retry = {"name": RETRY_AFTER, "value": str(serving.retry_after_s)}
            filters.append(
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [retry]}}
            )
        rules.append(
            {
                "name": c.name,
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}, "headers": [header]}],
                "filters": filters,
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": pool.name}],
            }
        )
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _meta(pool.name, pool.namespace),
        "spec": {"parentRefs": [parent], "rules": rules},
    }


def pool_objects(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> list[Manifest]:
    """Everything one pool needs, in apply order (the route last: it points at the pool)."""
    return [
        *endpoint_picker(policy, pool, api),
        inference_pool(policy, pool),
        *inference_objectives(policy, pool, api),
        http_route(policy, pool, api),
    ]


def class_services(policy: PoolPolicy) -> list[Manifest]:
    """The plain-Kubernetes fallback: a Service per model and traffic class over the pods
    that may serve it. Pods join and leave by readiness (vLLM's readiness probe on flex pods;
    the owner's on production pods); no readiness gate (docs/serving.md)."""
    serving = _serving(policy)
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(serving.objective_name(pool.model, c), pool.namespace),
            "spec": {
                "type": "ClusterIP",
                "selector": dict(pool.selector),
                "ports": [
                    {"name": "http", "port": pool.port, "targetPort": pool.port, "protocol": "TCP"}
                ],
            },
        }
        for pool in pools(policy)
        for c in pool.classes
    ]


def serving_groups(policy: PoolPolicy, options: ServingOptions) -> list[tuple[str, list[Manifest]]]:
    """``(group name, objects)`` of the serving layer under ``options`` (none when off);
    ServingProblem when ``serving_problems`` finds any."""
    problems = serving_problems(policy, options)
    if problems:
        raise ServingProblem("; ".join(f"{path}: {message}" for path, message in problems))
    if options.mode == "off":
        return []
    if options.mode == "services":
        return [("traffic-class-services", class_services(policy))]
    return [
        (pool.name, pool_objects(policy, pool, options.objective_api)) for pool in pools(policy)
    ]
