"""One pool's endpoint picker: its EndpointPickerConfig (scorers and saturation detector from
the policy), ConfigMap, Deployment, Service, RBAC, NetworkPolicy and PodMonitor."""

from __future__ import annotations

from typing import Any

from infra.builders.meta import Manifest, labels, selector_labels
from infra.builders.network import endpoint_picker_network_policy
from infra.builders.pod import container_security, pod_security, pull_secrets
from infra.builders.rbac import POOL_GROUP, endpoint_picker_rbac
from infra.builders.scraping import endpoint_picker_pod_monitor
from infra.builders.serving_options import DISTRIBUTIONS, ObjectiveApi
from infra.builders.serving_pools import COMPONENT, Pool, require_serving, serving_meta
from infra.yaml_text import to_yaml
from policy import PoolPolicy

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


def endpoint_picker_config(policy: PoolPolicy, api: ObjectiveApi) -> dict[str, Any]:
    """The EndpointPickerConfig of every pool: the policy's scorer weights, and the
    saturation detector at the policy's thresholds (KV usage ``page_table_max_usage``)."""
    picker = require_serving(policy).endpoint_picker
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


def _picker_container(policy: PoolPolicy, pool: Pool, api: ObjectiveApi) -> Manifest:
    """The picker's one container: its flags, ports, probes and mounts."""
    picker = require_serving(policy).endpoint_picker
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
        "metadata": serving_meta(name, pool.namespace),
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
        "metadata": serving_meta(pool.picker, pool.namespace),
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
        "metadata": serving_meta(pool.picker, pool.namespace),
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
            policy, ns, pods, (GRPC, METRICS), require_serving(policy).gateway.namespace
        ),
        # its request, shed and poll-error counters feed the serving alerts (alerts/serving.py)
        endpoint_picker_pod_monitor(policy, pool.name, ns, pods, METRICS),
    ]
