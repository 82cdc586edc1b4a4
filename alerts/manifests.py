"""Kubernetes objects that install gpupool's monitoring: what the Pulumi program declares.

- ``PrometheusRule`` (monitoring.coreos.com/v1): the recording rules (catalogue) and alerts.
- ``Secret`` ``alertmanager-main`` (policy.metrics.alertmanager_secret), key
  ``alertmanager.yaml``: the complete Alertmanager configuration, which the Prometheus
  operator loads for the Alertmanager of that name. A Secret (not an ``AlertmanagerConfig``
  CRD) because the CRD forces a ``namespace`` matcher onto every route, which would drop the
  cluster-wide alerts, and because the same file is what ``amtool`` checks in the tests.
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
from alerts.routing import alertmanager_config
from infra.yaml_text import to_yaml
from policy.pool import PoolPolicy


def _metadata(policy: PoolPolicy, name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": "gpupool", **policy.metrics.rule_selector_labels}
    return {
        "name": name,
        "namespace": policy.cluster.system_namespace,
        "labels": {**labels, **(extra or {})},
    }


def monitoring_objects(policy: PoolPolicy) -> list[dict[str, Any]]:
    """PrometheusRule, Alertmanager config Secret, dashboard ConfigMap."""
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": _metadata(policy, "gpupool"),
            "spec": {"groups": all_groups(policy)},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _metadata(policy, policy.metrics.alertmanager_secret),
            "type": "Opaque",
            "stringData": {
                "alertmanager.yaml": to_yaml(alertmanager_config(policy), sort_keys=False)
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(policy, "gpupool-dashboard", {"grafana_dashboard": "1"}),
            "data": {"gpupool.json": json.dumps(dashboard(policy), indent=2, sort_keys=True)},
        },
    ]
