"""Prerequisite alerts: what gpupool needs from the cluster, checked rather than assumed.

Each catalogue query joins exporters on labels that only exist when they are deployed as
docs/alerts.md ("What gpupool needs from the cluster") says. When a join comes up empty the
queries do not fail, they go quiet (the flex HPA holds, alerts stay silent), so every join is
checked here on the raw exporter series. These rules read raw series on purpose: a recorded
series cannot tell "zero" from "the join found nothing".

- NodePoolLabelsMissing: kube-state-metrics runs (``kube_node_labels`` exists) but no node
  has the pool label with a pool's name: kube-state-metrics lacks
  ``--metric-labels-allowlist=nodes=[<cluster.pool_label>]`` or the nodes are not labelled.
- GPUExporterDown: a dcgm-exporter target (``metrics.dcgm_job``) fails its scrapes.
- GPUsNotReporting: a gpupool node has fewer GPUs in dcgm-exporter (joined on
  ``metrics.gpu_node_label``) than it has allocatable; a node with none at all counts too.
- GPUPodAttributionMissing: production pods run on GPUs but no DCGM series names one of them
  (``metrics.gpu_pod_labels``): production's GPU utilization, the grow signal, is absent.

Which exporters exist at all (and which of their series must) is ``catalogue.sources``
(GpupoolMetricsStale and GpupoolMetricMissing in alerts/staleness.py).
"""

from __future__ import annotations

from alerts.rules import Group, Rule, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue, ksm_label

GPU_SERIES = "DCGM_FI_DEV_GPU_UTIL"
"""The dcgm-exporter series every GPU has (a default counter)."""


def _pools(policy: PoolPolicy) -> str:
    return "|".join(p.name for p in policy.node_pools)


def node_pool_labels_missing_expr(policy: PoolPolicy) -> str:
    """Nodes kube-state-metrics exports, where none carries a pool label of the policy."""
    label = ksm_label(policy.cluster.pool_label)
    return (
        "count(kube_node_labels) > 0 unless on () "
        f'count(kube_node_labels{{{label}=~"{_pools(policy)}"}})'
    )


def gpu_exporter_down_expr(policy: PoolPolicy) -> str:
    return f'up{{job=~"{policy.metrics.dcgm_job}"}} == 0'


def gpus_not_reporting_expr(policy: PoolPolicy) -> str:
    """Per gpupool node: allocatable GPUs minus the distinct GPUs dcgm-exporter reports for
    it, where positive; a node without any DCGM series reports 0."""
    m, label = policy.metrics, ksm_label(policy.cluster.pool_label)
    pools = (
        f'max by (node, pool) (label_replace(kube_node_labels{{{label}=~"{_pools(policy)}"}}, '
        f'"pool", "$1", "{label}", "(.*)"))'
    )
    allocatable = (
        f'max by (node) (kube_node_status_allocatable{{resource="{m.gpu_resource}"}})'
        f" * on (node) group_left (pool) {pools}"
    )
    gpus = f'label_replace({GPU_SERIES}, "node", "$1", "{m.gpu_node_label}", "(.*)")'
    reporting = f"count by (node) (count by (node, gpu) ({gpus}))"
    # group_left keeps ``pool``: a one-to-one match on (node) would keep ``node`` only.
    missing = (
        f"({allocatable}) - on (node) group_left () ({reporting} or on (node) (0 * {allocatable}))"
    )
    return f"({missing}) > 0"


def gpu_pod_attribution_missing_expr(policy: PoolPolicy) -> str:
    """GPUs that running production pods request, where dcgm-exporter runs but attributes no
    GPU to any production pod."""
    m = policy.metrics
    production = (
        "max by (namespace, pod) "
        f'(kube_pod_info{{priority_class="{policy.priorities.production.name}"}})'
    )
    running = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"} == 1)'
    held = (
        f'sum(kube_pod_container_resource_requests{{resource="{m.gpu_resource}", node!=""}}'
        f" * on (namespace, pod) group_left () {running}"
        f" * on (namespace, pod) group_left () {production})"
    )
    ns, pod = m.gpu_pod_labels
    gpu = GPU_SERIES
    for want, have in (("namespace", ns), ("pod", pod)):
        if have != want:
            gpu = f'label_replace({gpu}, "{want}", "$1", "{have}", "(.+)")'
    attributed = f"count({gpu} * on (namespace, pod) group_left () {production})"
    return f"({held} > 0) unless on () {attributed} and on () count({GPU_SERIES})"


def _node_pool_labels_missing(policy: PoolPolicy) -> Rule:
    """NodePoolLabelsMissing: kube-state-metrics exports no node's pool label."""
    t, cluster = policy.alerting.thresholds, policy.cluster
    label = ksm_label(cluster.pool_label)
    return alert(
        "NodePoolLabelsMissing",
        node_pool_labels_missing_expr(policy),
        t.node_pool_labels_missing,
        summary="kube-state-metrics exports no node's gpupool pool label.",
        description=(
            "kube-state-metrics exports {{ $value }} nodes, none with "
            f"{label} (node label {cluster.pool_label}) in {_pools(policy)}, for "
            f"{t.node_pool_labels_missing.for_}: kube-state-metrics lacks "
            f"--metric-labels-allowlist=nodes=[{cluster.pool_label}] (Helm: "
            f'metricLabelsAllowlist: ["nodes=[{cluster.pool_label}]"]) or no node '
            f"is labelled {cluster.pool_label}=<pool>. Until then headroom, "
            "reserves and the flex budget are empty: the flex HPA holds."
        ),
    )


def _gpu_exporter_down(policy: PoolPolicy) -> Rule:
    """GPUExporterDown: a dcgm-exporter target fails its scrapes."""
    t = policy.alerting.thresholds
    return alert(
        "GPUExporterDown",
        gpu_exporter_down_expr(policy),
        t.gpu_exporter_down,
        summary="A dcgm-exporter target is down.",
        description=(
            "dcgm-exporter target {{ $labels.instance }} (job {{ $labels.job }}) "
            f"has failed its scrapes for {t.gpu_exporter_down.for_}: its node's "
            "GPUs report no utilization or memory, and production's GPU "
            "utilization leaves them out."
        ),
    )


def _gpus_not_reporting(policy: PoolPolicy) -> Rule:
    """GPUsNotReporting: a node has fewer GPUs in dcgm-exporter than allocatable."""
    t, m = policy.alerting.thresholds, policy.metrics
    return alert(
        "GPUsNotReporting",
        gpus_not_reporting_expr(policy),
        t.gpus_not_reporting,
        summary="A gpupool node has GPUs that dcgm-exporter does not report.",
        description=(
            "{{ $value }} of node {{ $labels.node }}'s (pool {{ $labels.pool }}) "
            f"allocatable {m.gpu_resource} have had no {GPU_SERIES} series with "
            f"{m.gpu_node_label}=<node> for {t.gpus_not_reporting.for_}: "
            "dcgm-exporter is not running on the node, cannot see the GPUs, or "
            f"labels them with a {m.gpu_node_label} that is not the node name "
            "(metrics.gpu_node_label names the label holding it: Hostname, "
            "hostname in the newest dcgm-exporter releases)."
        ),
    )


def _gpu_pod_attribution_missing(policy: PoolPolicy) -> Rule:
    """GPUPodAttributionMissing: no DCGM series names a production pod."""
    t = policy.alerting.thresholds
    ns_label, pod_label = policy.metrics.gpu_pod_labels
    return alert(
        "GPUPodAttributionMissing",
        gpu_pod_attribution_missing_expr(policy),
        t.gpu_pod_attribution_missing,
        summary="dcgm-exporter does not attribute GPUs to production pods.",
        description=(
            "Running production pods request {{ $value }} GPUs but no "
            f"{GPU_SERIES} series names one of them in labels {ns_label}/"
            f"{pod_label} (metrics.gpu_pod_labels) for "
            f"{t.gpu_pod_attribution_missing.for_}: production's GPU utilization, "
            "the grow signal, is absent, so flex never grows. Run dcgm-exporter in "
            "Kubernetes mode (DCGM_EXPORTER_KUBERNETES=true with the kubelet "
            "pod-resources socket mounted; its Helm chart and the GPU operator do "
            "this) and, if the scrape does not honor labels (honorLabels: false), "
            "set metrics.gpu_pod_labels: [exported_namespace, exported_pod]."
        ),
    )


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    """The prerequisites group: pool labels, dcgm-exporter up, GPUs and pods reported."""
    rules = [
        _node_pool_labels_missing(policy),
        _gpu_exporter_down(policy),
        _gpus_not_reporting(policy),
        _gpu_pod_attribution_missing(policy),
    ]
    return [group("gpupool.prerequisites", policy, rules)]
