"""Kubernetes objects that install gpupool's monitoring: what the Pulumi program declares.

- ``PrometheusRule`` (monitoring.coreos.com/v1): the recording rules (catalogue) and alerts.
- ``AlertmanagerConfig`` (monitoring.coreos.com/v1alpha1) ``gpupool`` in
  ``network.alertmanager_namespace``: gpupool's routes and receivers, which the operator adds
  to the cluster's Alertmanager configuration instead of replacing it; credentials are
  references to Secrets in that namespace, never values (``alerts.routing``).
- ``ConfigMap`` labelled ``grafana_dashboard: "1"`` holding the dashboard JSON.

The prometheus-adapter rules are NOT an object here: the cluster's one adapter reads one
``config.yaml``, and a ConfigMap of gpupool's would replace the owner's rules. They are
rendered as a fragment to merge (``alerts.adapter``, ``infra.render.adapter_documents``).
"""

from __future__ import annotations

import json
from typing import Any

from alerts.bundle import all_groups
from alerts.dashboard import dashboard
from alerts.routing import alertmanager_config_object
from policy.pool import PoolPolicy


def _metadata(
    name: str, namespace: str, labels: dict[str, str], extra: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/part-of": "gpupool", **labels, **(extra or {})},
    }


def monitoring_objects(policy: PoolPolicy) -> list[dict[str, Any]]:
    """PrometheusRule, AlertmanagerConfig, dashboard ConfigMap."""
    system, rules = policy.cluster.system_namespace, policy.metrics.rule_selector_labels
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": _metadata("gpupool", system, rules),
            "spec": {"groups": all_groups(policy)},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1alpha1",
            "kind": "AlertmanagerConfig",
            "metadata": _metadata(
                "gpupool",
                policy.network.alertmanager_home,
                policy.metrics.alertmanager_config_labels,
            ),
            "spec": alertmanager_config_object(policy),
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata("gpupool-dashboard", system, rules, {"grafana_dashboard": "1"}),
            "data": {"gpupool.json": json.dumps(dashboard(policy), indent=2, sort_keys=True)},
        },
    ]
