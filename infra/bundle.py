"""The whole bundle: every object the policy implies, grouped the way the Pulumi program groups
them, in a deterministic apply order (cluster-scoped first, then namespaced)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from alerts.manifests import monitoring_objects
from infra.builders.meta import Manifest
from infra.builders.namespaces import namespaces
from infra.builders.nodepools import Target, node_pools
from infra.builders.policy_config import policy_config_map
from infra.builders.priorities import priority_classes
from infra.builders.production import production_autoscalers
from infra.builders.rbac import service_accounts_and_rbac
from infra.builders.runtime_components import tuner
from infra.builders.scraping import flex_pod_monitor
from infra.builders.workload import HpaTolerance, flex_workload
from policy import PoolPolicy

INFERENCE_WORKLOAD = "gpupool:flex:InferenceWorkload"
"""Pulumi type token of one flex workload's component."""

SCHEDULING = "gpupool:cluster:Scheduling"
"""Pulumi type token of the namespaces + PriorityClasses component; everything else needs it."""

MONITORING = "gpupool:system:Monitoring"
"""Pulumi type token of the monitoring objects (``alerts.manifests`` and the PodMonitor)."""

PRODUCTION = "gpupool:production:Autoscaling"
"""Pulumi type token of the HPAs gpupool renders for production workloads (only when some
production workload has ``scale_on: gpu_utilization``)."""


@dataclass(frozen=True)
class ObjectGroup:
    """Objects that belong together: one Pulumi ComponentResource, one section of a summary."""

    component: str
    """Pulumi type token (``package:module:Type``) of the component that owns the objects."""
    name: str
    """Component name; children are named after it."""
    objects: tuple[Manifest, ...]
    """The objects, in apply order."""


class MissingVllmArgs(ValueError):
    """A workload has no vLLM arguments: the edge that computes them skipped it."""


def build_groups(
    policy: PoolPolicy,
    *,
    target: Target,
    vllm_args: Mapping[str, Sequence[str]],
    hpa_tolerance: HpaTolerance = "cluster",
) -> list[ObjectGroup]:
    """Every object, grouped; ``vllm_args`` maps workload name -> the vLLM container args;
    ``target`` and ``hpa_tolerance`` are the stack's options (docs/infra.md)."""
    missing = [w.name for w in policy.workloads if w.name not in vllm_args]
    if missing:
        raise MissingVllmArgs(f"no vLLM arguments for workloads {missing}")
    groups = [
        ObjectGroup(
            SCHEDULING,
            "scheduling",
            (*namespaces(policy), *priority_classes(policy)),
        ),
        ObjectGroup(
            "gpupool:cluster:NodePools", f"node-pools-{target}", tuple(node_pools(policy, target))
        ),
        ObjectGroup(
            "gpupool:system:RuntimeComponents",
            "runtime",
            (*service_accounts_and_rbac(policy), *policy_config_map(policy), *tuner(policy)),
        ),
        ObjectGroup(
            MONITORING, "monitoring", (*monitoring_objects(policy), flex_pod_monitor(policy))
        ),
    ]
    hpas = production_autoscalers(policy)
    if hpas:
        groups.append(ObjectGroup(PRODUCTION, "production", tuple(hpas)))
    groups += [
        ObjectGroup(
            INFERENCE_WORKLOAD,
            w.name,
            tuple(flex_workload(policy, w, vllm_args[w.name], hpa_tolerance)),
        )
        for w in policy.workloads
    ]
    return groups


def build_bundle(
    policy: PoolPolicy,
    *,
    target: Target,
    vllm_args: Mapping[str, Sequence[str]],
    hpa_tolerance: HpaTolerance = "cluster",
) -> list[Manifest]:
    """Every object the policy implies, flat, in apply order."""
    groups = build_groups(policy, target=target, vllm_args=vllm_args, hpa_tolerance=hpa_tolerance)
    return [obj for group in groups for obj in group.objects]
