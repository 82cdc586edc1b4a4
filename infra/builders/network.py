"""NetworkPolicies: each port a gpupool pod listens on admits only the clients that need it.

- flex pod, vLLM port (``http``: OpenAI API, ``/metrics``): pods of the flex namespace, of
  ``network.flex_client_namespaces`` (the gateway or router), and Prometheus;
- flex pod, compaction sidecar port (``kv-metrics``): the tuner (compaction requests) and
  Prometheus;
- tuner, webhook port (``http``): Alertmanager (the ``gpupool-tuner`` receiver; by default in
  the system namespace, beside the configuration Secret the bundle renders for it); its
  health and metrics port (``ops``: ``/healthz``, ``/metrics``, no token): Prometheus;
- endpoint picker (serving layer), ext_proc port: the Gateway's namespace; its metrics port:
  Prometheus.

Ingress only: egress stays open (vLLM downloads weights, the tuner reaches git and
Prometheus). Peers are selected by the ``kubernetes.io/metadata.name`` label the API server
puts on every namespace. Enforced only by a CNI that implements NetworkPolicy (Calico,
Cilium, ...); elsewhere they are inert. Kubelet probes come from the node and are not
subject to them.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.builders.compaction_sidecar import METRICS_PORT
from infra.builders.meta import Manifest, metadata, selector_labels
from infra.builders.rbac import TUNER_SERVICE_ACCOUNT
from infra.builders.runtime_components import TUNER_OPS_PORT, TUNER_PORT
from infra.builders.snapshot_gc import preserving
from infra.builders.vllm_container import HTTP_PORT
from infra.builders.workload import COMPONENT
from policy import PoolPolicy
from policy.workloads import FlexWorkload

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Label the API server sets on every Namespace to its name (immutable, Kubernetes >= 1.21)."""


def _namespace(name: str) -> Manifest:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def _pods(namespace: str, pod_labels: dict[str, str]) -> Manifest:
    """Pods with ``pod_labels`` in ``namespace`` (both must match)."""
    return _namespace(namespace) | {"podSelector": {"matchLabels": dict(pod_labels)}}


def _prometheus(policy: PoolPolicy) -> Manifest:
    return _pods(policy.network.monitoring_namespace, policy.network.prometheus_pod_labels)


def _rule(peers: list[Manifest], port: str) -> Manifest:
    return {"from": peers, "ports": [{"port": port, "protocol": "TCP"}]}


def _policy(name: str, component: str, namespace: str, pods: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, component, namespace=namespace, instance=name),
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"]},
    }


def flex_network_policy(
    policy: PoolPolicy, workload: FlexWorkload, serving_clients: Sequence[str] = ()
) -> Manifest:
    """Ingress of ``workload``'s pods: vLLM's port, and the sidecar's when it runs.

    ``serving_clients``: namespaces the serving layer adds (the Gateway's, whose proxy sends
    each request to the instance the endpoint picker chose); the pickers of the flex pools
    run in the flex namespace, which is admitted already."""
    prometheus = _prometheus(policy)
    namespaces = dict.fromkeys([*policy.network.flex_client_namespaces, *serving_clients])
    clients = [{"podSelector": {}}, *map(_namespace, namespaces)]
    rules = [_rule([*clients, prometheus], HTTP_PORT)]
    if workload.kv_compaction:
        tuner = _pods(policy.cluster.system_namespace, selector_labels(TUNER_SERVICE_ACCOUNT))
        rules.append(_rule([tuner, prometheus], METRICS_PORT))
    elif preserving(policy):  # the snapshot GC's /metrics: Prometheus only
        rules.append(_rule([prometheus], METRICS_PORT))
    out = _policy(
        workload.name, COMPONENT, policy.cluster.flex_namespace, selector_labels(workload.name)
    )
    out["spec"]["ingress"] = rules
    return out


def tuner_network_policy(policy: PoolPolicy) -> Manifest:
    """Ingress of the tuner: its webhook port from Alertmanager only, its health and metrics
    port from Prometheus only (``/metrics`` has no token: this is what guards it)."""
    out = _policy(
        TUNER_SERVICE_ACCOUNT,
        "tuner",
        policy.cluster.system_namespace,
        selector_labels(TUNER_SERVICE_ACCOUNT),
    )
    network = policy.network
    alertmanager = network.alertmanager_home
    out["spec"]["ingress"] = [
        _rule([_pods(alertmanager, network.alertmanager_pod_labels)], TUNER_PORT),
        _rule([_prometheus(policy)], TUNER_OPS_PORT),
    ]
    return out


def endpoint_picker_network_policy(
    policy: PoolPolicy,
    namespace: str,
    pods: dict[str, str],
    ports: tuple[str, str],
    gateway_namespace: str,
) -> Manifest:
    """Ingress of one endpoint picker: its ext_proc port (``ports[0]``) from the Gateway's
    namespace (its proxy asks the picker for every request), its metrics port (``ports[1]``)
    from Prometheus. The picker calls the instances, never the reverse."""
    name = pods["app.kubernetes.io/instance"]
    out = _policy(name, "serving", namespace, pods)
    grpc, metrics = ports
    out["spec"]["ingress"] = [
        _rule([_namespace(gateway_namespace)], grpc),
        _rule([_prometheus(policy)], metrics),
    ]
    return out
