"""The autoscaling/v2 HorizontalPodAutoscaler shape shared by the flex and the production
HPAs: what differs between them (metric, limits, tolerance) is passed in."""

from __future__ import annotations

from typing import Literal

from infra.builders.meta import Manifest


def rate_limit(kind: Literal["Pods", "Percent"], value: int, period_s: int) -> Manifest:
    """One HPA scaling policy: at most ``value`` pods (or percent) per ``period_s``."""
    return {"type": kind, "value": value, "periodSeconds": period_s}


def scaling_rule(window_s: int, limits: list[Manifest], tolerance: Manifest) -> Manifest:
    """One direction of ``behavior``: ``tolerance`` (empty, or ``{"tolerance": ...}``), the
    stabilization window, and the most permissive of ``limits`` (``selectPolicy: Max``)."""
    return {
        **tolerance,
        "stabilizationWindowSeconds": window_s,
        "selectPolicy": "Max",
        "policies": limits,
    }


def horizontal_pod_autoscaler(
    meta: Manifest,
    target: Manifest,
    replicas: tuple[int, int],
    metric: Manifest,
    scale_up: Manifest,
    scale_down: Manifest,
) -> Manifest:
    """An HPA on one ``metric`` scaling ``target`` (its ``scaleTargetRef``) within
    ``replicas`` (min, max)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": replicas[0],
            "maxReplicas": replicas[1],
            "metrics": [metric],
            "behavior": {"scaleUp": scale_up, "scaleDown": scale_down},
        },
    }
