"""The defaults the brief promises, pinned; and every field documented."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from policy import DEFAULT_POLICY, PoolPolicy, load_policy
from policy.alerting import AlertThresholds
from policy.disruption import Disruption
from policy.elastic import Autoscaling, ElasticThresholds
from policy.kvcache import KvCache
from policy.metrics import MetricSources
from policy.priorities import Priorities
from policy.tuner import Tuner


def test_brief_defaults_in_models() -> None:
    elastic, autoscaling, disruption = ElasticThresholds(), Autoscaling(), Disruption()
    kv, alerts, prio = KvCache(), AlertThresholds(), Priorities()
    assert (elastic.grow_while_production_below, elastic.shed_while_production_above) == (
        0.35,
        0.65,
    )
    assert (autoscaling.scale_up_stabilization_s, autoscaling.scale_down_stabilization_s) == (
        180,
        300,
    )
    assert disruption.termination_grace_s >= 30
    assert disruption.termination_grace_s >= disruption.shutdown_budget_s
    assert prio.idle_inference.value == -1
    assert prio.production.value > prio.training.value > 0 > prio.idle_inference.value
    assert (kv.page_bytes_target, kv.max_gpu_memory_share, kv.page_table_max_usage) == (
        4096,
        0.75,
        0.80,
    )
    assert alerts.flex_eviction_rate.per_minute_max == 5
    assert alerts.kv_hit_rate.min == 0.80


def test_shipped_policy_matches_model_defaults() -> None:
    """pool.yaml restates the defaults; a drift between file and model is a review smell."""
    policy = load_policy(DEFAULT_POLICY)
    assert policy.elastic == ElasticThresholds()
    assert policy.autoscaling == Autoscaling()
    assert policy.disruption == Disruption()
    assert policy.kv_cache == KvCache()
    assert policy.priorities == Priorities()
    assert policy.alerting.thresholds == AlertThresholds()
    assert policy.metrics == MetricSources()
    assert policy.tuner == Tuner(policy_repo_url=policy.tuner.policy_repo_url)  # yours: required
    assert policy.prod_pool.name == "gpu-prod"
    assert [p.name for p in policy.flex_pools] == ["gpu-flex"]


def _undocumented(model: type[BaseModel], seen: set[type[BaseModel]]) -> list[str]:
    missing: list[str] = []
    if model in seen:
        return missing
    seen.add(model)
    for name, field in model.model_fields.items():
        if not field.description:
            missing.append(f"{model.__name__}.{name}")
        for arg in _model_types(field.annotation):
            missing += _undocumented(arg, seen)
    return missing


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _model_types(arg)]


def test_every_field_has_a_docstring() -> None:
    assert _undocumented(PoolPolicy, set()) == []
