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

from infra.builders.endpoint_picker import GRPC_PORT, endpoint_picker
from infra.builders.meta import Manifest
from infra.builders.rbac import POOL_GROUP
from infra.builders.serving_options import (
    DISTRIBUTIONS,
    OBJECTIVE_HEADER,
    ObjectiveApi,
    ServingOptions,
)
from infra.builders.serving_pools import (
    Pool,
    ServingProblem,
    pools,
    require_serving,
    serving_meta,
    serving_problems,
)
from policy import PoolPolicy

RETRY_AFTER = "Retry-After"
"""Response header the sheddable classes' routes set with ``serving.retry_after_s``."""

POOL_API = f"{POOL_GROUP}/v1"


ROUTE_GROUP = "gateway.networking.k8s.io"

ROUTE_API = f"{ROUTE_GROUP}/v1"


def inference_pool(policy: PoolPolicy, pool: Pool) -> Manifest:
    """The InferencePool: the pool's pods on their serving port, and its picker."""
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": serving_meta(pool.name, pool.namespace),
        "spec": {
            "selector": {"matchLabels": dict(pool.selector)},
            "targetPorts": [{"number": pool.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": pool.picker,
                "port": {"number": GRPC_PORT},
                "failureMode": require_serving(policy).endpoint_picker.failure_mode,
            },
        },
    }


def inference_objectives(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> list[Manifest]:
    """One InferenceObjective per traffic class the pool serves: its priority, in the pool."""
    serving = require_serving(policy)
    return [
        {
            "apiVersion": api,
            "kind": "InferenceObjective",
            "metadata": serving_meta(serving.objective_name(pool.model, c), pool.namespace),
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
    serving = require_serving(policy)
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
        "metadata": serving_meta(pool.name, pool.namespace),
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
    serving = require_serving(policy)
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": serving_meta(serving.objective_name(pool.model, c), pool.namespace),
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
