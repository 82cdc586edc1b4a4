"""Hostile values, generated: validation is as strict as the programs that read each value.

Each test draws a field of one grammar and a value near the valid ones (any script, any
trailing character, look-alike digits, option-like prefixes; numbers across int32 and
beyond), writes the default policy with it and runs ``gpupool validate`` and ``gpupool
render``. Either both succeed and the consumer's own grammar (``tests.harness.hostile``:
the API server's, Prometheus', the registries') accepts the value, or both exit 1 with one
``FILE:LINE: field: message`` line per problem, one at the field, no traceback and nothing
written. ``$``-anchored ``re.match``, ``\\d`` and ``\\w`` let ``name\\n``, ``\\u0665m``
(an Arabic-Indic five) and tags in other scripts through before; int fields had no upper
bound.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.harness import hostile as h
from tests.harness.policy_docs import set_path
from tests.infra.policies import edited

CASES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(field: str, value: Any, valid: Callable[[Any], bool], **extra: Any) -> bool:
    doc = edited(extra)
    section = field.split(".")[0]
    doc.setdefault(section, {})  # network, tuner: sections the default policy leaves out
    set_path(doc, field, value)
    with tempfile.TemporaryDirectory() as folder:
        return h.check_field(Path(folder), doc, field, value, valid(value))


NAMES: dict[str, Callable[[Any], bool]] = {
    "cluster.name": h.is_dns_label,
    "cluster.flex_namespace": h.is_dns_label,
    "cluster.system_namespace": h.is_dns_label,
    "cluster.image_pull_secrets.0": h.is_subdomain,
    "network.monitoring_namespace": h.is_dns_label,
    "workloads.0.name": h.is_service_name,
    "workloads.0.snapshot_volume.storage_class": h.is_subdomain,
    "node_pools.0.nodes.0": h.is_subdomain,
    "node_pools.1.karpenter.node_class": h.is_subdomain,
    "priorities.production.name": h.is_subdomain,
    "network.alertmanager_namespace": h.is_dns_label,
    "tuner.webhook_token_secret": h.is_subdomain,
}
"""Fields that name a Kubernetes object, and the API server's rule for that object."""


@pytest.mark.heavy
@CASES
@given(field=st.sampled_from(sorted(NAMES)), value=h.hostile(["gpu-flex", "ip-10-0-1-23.ec2"]))
@example(field="cluster.flex_namespace", value="gpupool-flex\n")
@example(field="workloads.0.name", value="llama-8b-flex\n")
@example(field="node_pools.0.nodes.0", value="gpupool-worker\n")
def test_names_are_what_the_api_server_accepts(field: str, value: Any) -> None:
    _check(field, value, NAMES[field], **{"cluster.image_pull_secrets": ["registry"]})


LABELS: dict[str, Callable[[Any], bool]] = {
    "cluster.pool_label": h.is_label_key,
    "node_pools.0.gpu_model": lambda v: h.is_label_value(v) and bool(v),
    "metrics.workload_label": h.is_prometheus_label,
    "metrics.gpu_node_label": h.is_prometheus_label,
    "metrics.instance_labels.2": h.is_prometheus_label,
    "metrics.gpu_pod_labels.1": h.is_prometheus_label,
    "alerting.routing.group_by.0": lambda v: v == "..." or h.is_prometheus_label(v),
}
"""Fields that become Kubernetes labels or Prometheus label names."""


@pytest.mark.heavy
@CASES
@given(
    field=st.sampled_from(sorted(LABELS)),
    value=h.hostile(["gpupool.io/pool", "NVIDIA-H200", "workload", "Hostname"]),
)
@example(field="metrics.workload_label", value="workload\n")
def test_labels_are_what_kubernetes_and_prometheus_accept(field: str, value: Any) -> None:
    extra = {"alerting.routing.group_by": ["alertname"], "metrics.gpu_pod_labels": ["ns", "pod"]}
    _check(field, value, LABELS[field], **extra)


DURATIONS = [
    "metrics.rate_window",
    "metrics.evaluation_interval",
    "alerting.thresholds.kv_hit_rate.for",
    "alerting.thresholds.kv_hit_rate.warmup",
    "alerting.thresholds.flex_eviction_rate.keep_firing_for",
    "alerting.routing.group_wait",
    "alerting.routing.repeat_interval",
    "kv_cache.compaction_min_interval",
]
"""Fields that reach Prometheus (rules, ``for:``, windows) or Alertmanager as durations."""


def _positive_duration(value: Any) -> bool:
    """Prometheus' grammar, above 0 and at most a year (longer is a typo, not a window)."""
    if not h.is_prometheus_duration(value):
        return False
    return 0 < h.duration_ms(value) <= 365 * 86400 * 1000


@pytest.mark.heavy
@CASES
@given(field=st.sampled_from(DURATIONS), value=h.hostile(["5m", "1h30m", "30s", "15m", "4h"]))
@example(field="metrics.rate_window", value="\u0665m")
@example(field="metrics.rate_window", value="5m\n")
def test_durations_are_prometheus_durations(field: str, value: Any) -> None:
    _check(field, value, _positive_duration)


IMAGES = ["cluster.runtime_image", "workloads.0.image"]


@pytest.mark.heavy
@CASES
@given(
    field=st.sampled_from(IMAGES),
    value=h.hostile(
        [
            "vllm/vllm-openai:v0.32.0",
            "registry.example.invalid:5000/gpupool/gpupool:0.1.0",
            "vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4,
        ]
    ),
)
@example(field="workloads.0.image", value="vllm/vllm-openai:v0.32.0\n")
@example(field="workloads.0.image", value="vllm/vllm-openai:v0.32.\u00e9")
def test_images_are_oci_references(field: str, value: Any) -> None:
    _check(field, value, h.is_image_reference)


def _int32(low: int = 0, high: int = h.INT32[1]) -> Callable[[Any], bool]:
    """An integer Kubernetes stores as int32, within ``[low, high]``."""

    def ok(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not math.isfinite(value):
            return False
        return value == int(value) and low <= value <= high and h.INT32[0] <= value <= h.INT32[1]

    return ok


NUMBERS: dict[str, Callable[[Any], bool]] = {
    "node_pools.0.max_nodes": _int32(1, 5000),  # Kubernetes supports clusters of 5,000 nodes
    "node_pools.1.max_nodes": _int32(1, 5000),
    "autoscaling.scale_up_pods_per_minute": _int32(1),
    "autoscaling.scale_down_pods_per_minute": _int32(1),
    "autoscaling.scale_up_stabilization_s": _int32(0, 3600),  # the HPA's own limit
    "disruption.pdb_min_available": _int32(0),
    "disruption.readiness_period_s": _int32(1),
    "disruption.termination_grace_s": _int32(1),
    "workloads.0.min_replicas": _int32(1),
    "workloads.0.max_replicas": _int32(1),
    "workloads.0.port": _int32(1, 65535),
    "workloads.0.startup_timeout_s": _int32(1),
    "workloads.0.max_num_seqs": _int32(1),
    "cluster.tuner_port": _int32(1, 65535),
    "cluster.tuner_ops_port": _int32(1, 65535),
    "production.0.min_replicas": _int32(1),
    "production.0.max_replicas": _int32(1),
    "priorities.training.value": _int32(-(10**9), 10**9),  # above 1e9: system classes only
    "kv_cache.compaction_sidecar_port": _int32(1, 65535),
}
"""Integer fields that reach an int32 field of a Kubernetes object, and its bounds."""


@pytest.mark.heavy
@CASES
@given(field=st.sampled_from(sorted(NUMBERS)), value=h.numbers)
@example(field="node_pools.0.max_nodes", value=10**23)
@example(field="autoscaling.scale_up_pods_per_minute", value=3_000_000_000)
@example(field="autoscaling.scale_down_pods_per_minute", value=float("inf"))
def test_numbers_fit_the_fields_that_store_them(field: str, value: Any) -> None:
    _check(field, value, NUMBERS[field])
