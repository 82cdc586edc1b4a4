"""Grafana dashboard over the recorded ``gpupool:`` series.

Raw exporter series appear only where recording would copy them unchanged: Deployment
replicas, and the snapshot tier's per-pod restore gauges (one value per replica start).
"""

from __future__ import annotations

from typing import Any

from policy.pool import PoolPolicy
from runtime.metrics.catalogue import (
    CLUSTER_GPU_UTILIZATION,
    FLEX_EVICTIONS,
    FLEX_GPU_BUDGET,
    FLEX_HEADROOM_GPUS,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    KV_CACHE_HIT_RATE,
    KV_CACHE_USAGE,
    KV_TIER_DELETIONS,
    KV_TIER_FILL,
    POOL_GPU_UTILIZATION,
    PROD_PODS_PENDING,
    PRODUCTION_GPU_UTILIZATION,
    PROMPT_TOKENS_FROM_TIER,
    SPARE_GPUS,
    UNALLOCATED_GPUS,
    num,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_W, PANEL_H = 12, 8


PanelSpec = tuple[str, list[tuple[str, str]], str, list[float] | None]
"""(title, [(expr, legend)], unit, threshold lines)."""


def _row(panel_id: int, title: str, y: int) -> dict[str, Any]:
    """A Grafana row header: the panels below it, up to the next row, form its group."""
    return {
        "id": panel_id,
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"x": 0, "y": y, "w": 2 * PANEL_W, "h": 1},
    }


def _layout(sections: list[tuple[str | None, list[PanelSpec]]]) -> list[dict[str, Any]]:
    """Panels two per line, each titled section under a row header, ids in order."""
    out: list[dict[str, Any]] = []
    y = 0
    for title, specs in sections:
        if title is not None:
            out.append(_row(len(out) + 1, title, y))
            y += 1
        for i, spec in enumerate(specs):
            out.append(_panel(len(out) + 1, (i % 2) * PANEL_W, y + (i // 2) * PANEL_H, *spec))
        y += (len(specs) + 1) // 2 * PANEL_H
    return out


def _panel(
    panel_id: int,
    x: int,
    y: int,
    title: str,
    targets: list[tuple[str, str]],
    unit: str,
    thresholds: list[float] | None = None,
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [
        {"color": c, "value": v} for c, v in zip(("orange", "red"), thresholds or [], strict=False)
    ]
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": PANEL_W, "h": PANEL_H},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "custom": {"thresholdsStyle": {"mode": "line" if thresholds else "off"}},
            },
            "overrides": [],
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": DATASOURCE,
            }
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _overview_panels(policy: PoolPolicy) -> list[PanelSpec]:
    """The pool at a glance: the grow/shed signal, GPUs free to flex, utilization."""
    e = policy.elastic
    band = [e.grow_while_production_below, e.shed_while_production_above]
    return [
        (
            "Production GPU utilization vs the grow/shed band",
            [
                (PRODUCTION_GPU_UTILIZATION, "production (grow/shed signal)"),
                (CLUSTER_GPU_UTILIZATION, "all GPUs (flex included)"),
            ],
            "percentunit",
            band,
        ),
        (
            "Unallocated, spare and flex headroom GPUs",
            [
                (UNALLOCATED_GPUS, "{{pool}} unallocated"),
                (SPARE_GPUS, "spare beyond reserves and pending production"),
                (FLEX_HEADROOM_GPUS, "{{pool}} flex headroom"),
                (PROD_PODS_PENDING, "unschedulable production pods"),
            ],
            "short",
            None,
        ),
        (
            "GPU utilization by pool",
            [(POOL_GPU_UTILIZATION, "{{pool}}"), (CLUSTER_GPU_UTILIZATION, "cluster")],
            "percentunit",
            None,
        ),
        (
            "GPU utilization by node",
            [(f"avg by (node, pool) ({GPU_UTILIZATION})", "{{node}} ({{pool}})")],
            "percentunit",
            None,
        ),
    ]


def _flex_panels(policy: PoolPolicy) -> list[PanelSpec]:
    """The flex tier: replicas against budget and headroom, evictions, KV cache, memory."""
    t = policy.alerting.thresholds
    ns = policy.cluster.flex_namespace
    node = policy.metrics.gpu_node_label
    return [
        (
            "Flex replicas and GPU budget",
            [
                (
                    f'sum by (deployment) (kube_deployment_status_replicas{{namespace="{ns}"}})',
                    "{{deployment}} replicas",
                ),
                (FLEX_GPU_BUDGET, "{{workload}} budget (GPUs)"),
                (FLEX_HEADROOM_GPUS, "{{pool}} headroom (GPUs)"),
            ],
            "short",
            None,
        ),
        (
            "Flex evictions per minute",
            [(FLEX_EVICTIONS, "{{namespace}} {{reason}}")],
            "short",
            [t.flex_eviction_rate.per_minute_max],
        ),
        ("KV-cache usage", [(KV_CACHE_USAGE, "{{pod}}")], "percentunit", None),
        (
            "KV prefix-cache hit rate",
            [(KV_CACHE_HIT_RATE, "{{pod}}")],
            "percentunit",
            [t.kv_hit_rate.min],
        ),
        (
            "GPU memory used",
            [(GPU_MEMORY_USED, f"{{{{{node}}}}} GPU {{{{gpu}}}}")],
            "percentunit",
            [t.gpu_memory_pressure.max],
        ),
    ]


def _kv_tier_panels(policy: PoolPolicy) -> list[PanelSpec]:
    """The KV snapshot tier's row: fill, GC, and what restores bought each replica."""
    per_pod = f'namespace="{policy.cluster.flex_namespace}"'
    by_pod = ", ".join(policy.metrics.instance_labels)
    workload = f"{{{{{policy.metrics.workload_label}}}}}"
    return [
        (
            "KV snapshot tier fill (used / tier_capacity)",
            [(KV_TIER_FILL, workload)],
            "percentunit",
            [1.0],
        ),
        (
            "KV snapshot GC deletions per minute",
            [(KV_TIER_DELETIONS, f"{workload} {{{{reason}}}}")],
            "short",
            None,
        ),
        (
            "Restored hits in the first minute of each replica",
            [
                (
                    f"max by ({by_pod}) (gpupool_kv_tier_restored_hits_first_minute{{{per_pod}}})",
                    "{{pod}}",
                )
            ],
            "short",
            None,
        ),
        (
            "Time from tier start to its first hit",
            [
                (
                    f"max by ({by_pod}) (gpupool_kv_tier_first_hit_seconds{{{per_pod}}})",
                    "{{pod}}",
                )
            ],
            "s",
            None,
        ),
        (
            "Share of prefill tokens loaded from the KV tiers",
            [(PROMPT_TOKENS_FROM_TIER, "{{pod}}")],
            "percentunit",
            None,
        ),
    ]


def dashboard(policy: PoolPolicy) -> dict[str, Any]:
    """The dashboard JSON model; thresholds drawn from the policy, nodes named by
    ``metrics.gpu_node_label`` (the dcgm-exporter label) or ``node`` (joined series)."""
    e = policy.elastic
    grow, shed = num(e.grow_while_production_below), num(e.shed_while_production_above)
    return {
        "uid": f"gpupool-{policy.cluster.name}"[:40],
        "title": f"gpupool: {policy.cluster.name}",
        "tags": ["gpupool"],
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": policy.metrics.evaluation_interval,
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "description": "Recorded series of the gpupool catalogue; thresholds from the policy "
        f"(flex grows while production's GPU utilization is below {grow}, sheds above {shed}).",
        "panels": _layout(
            [
                (None, _overview_panels(policy) + _flex_panels(policy)),
                ("KV snapshot tier (kv_preservation: filesystem)", _kv_tier_panels(policy)),
            ]
        ),
    }
