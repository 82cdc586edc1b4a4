"""The whole bundle: every object the policy implies, grouped the way the Pulumi program groups
them, in a deterministic apply order (cluster-scoped first, then namespaced).

Two passes run over every object: namespaces and claims get the GitOps keep-annotations
(``meta.retained``), and no two objects may share a cluster identity (kind, namespace,
name) or a Pulumi URN (component type, resource type, logical name), so the rendered set and
the Pulumi program can never silently drop or overwrite one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from alerts.manifests import monitoring_objects
from infra.builders.meta import Manifest, retained
from infra.builders.namespaces import namespaces
from infra.builders.network import flex_network_policy, tuner_network_policy
from infra.builders.nodepools import node_pools
from infra.builders.policy_config import policy_config_map
from infra.builders.priorities import priority_classes
from infra.builders.production import production_autoscalers
from infra.builders.rbac import service_accounts
from infra.builders.runtime_components import tuner
from infra.builders.scraping import flex_pod_monitor
from infra.builders.serving import serving_groups
from infra.builders.serving_options import ServingOptions
from infra.builders.serving_pools import flex_pod_labels
from infra.builders.stack_options import StackOptions, Target
from infra.builders.workload import flex_workload
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

SERVING = {
    "inference-extension": "gpupool:serving:InferencePool",
    "services": "gpupool:serving:TrafficClassServices",
}
"""Pulumi type token of the serving groups per ``gpupool:serving`` mode: one component per
pool (its endpoint picker, InferencePool, objectives and route), or one for the Services."""


@dataclass(frozen=True)
class ObjectGroup:
    """Objects that belong together: one Pulumi ComponentResource, one section of a summary."""

    component: str
    """Pulumi type token (``package:module:Type``) of the component that owns the objects."""
    name: str
    """Component name; children are named after it."""
    objects: tuple[Manifest, ...]
    """The objects, in apply order."""


SHORT_KIND = {
    "PersistentVolumeClaim": "pvc",
    "Service": "svc",
    "PodDisruptionBudget": "pdb",
    "HorizontalPodAutoscaler": "hpa",
}
"""Suffixes of Pulumi child names (``f"{name}-pdb"``); other kinds use the lower-case kind."""


def logical_name(obj: Manifest) -> str:
    """Pulumi name of an object's resource: ``<name>-<short kind>``, unique per kind."""
    kind = obj["kind"]
    return f"{obj['metadata']['name']}-{SHORT_KIND.get(kind, kind.lower())}"


class MissingVllmArgs(ValueError):
    """A workload has no vLLM arguments: the edge that computes them skipped it."""


class DuplicateObject(ValueError):
    """Two objects of the bundle would be one object in the cluster or one Pulumi resource."""


def _identity(obj: Manifest) -> tuple[str, str, str | None, str]:
    """What the API server keys an object by: group, kind, namespace, name."""
    group = obj["apiVersion"].rpartition("/")[0]
    return group, obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def check_unique(groups: Sequence[ObjectGroup]) -> None:
    """Raise ``DuplicateObject`` naming both owners when two objects collide.

    Policy validation rejects the names that would collide; this is the bundle's own
    guarantee, so a builder change can never make render and Pulumi disagree."""
    seen: dict[tuple[str, ...], str] = {}
    for group in groups:
        for obj in group.objects:
            group_key, kind, namespace, name = _identity(obj)
            where = f"{kind} {namespace + '/' if namespace else ''}{name} (group {group.name})"
            keys = {
                "the same object": ("object", group_key, kind, namespace or "", name),
                "the same Pulumi URN": ("urn", group.component, group_key, kind, logical_name(obj)),
            }
            for what, key in keys.items():
                if key in seen:
                    raise DuplicateObject(f"{seen[key]} and {where} are {what}")
                seen[key] = where


def _system_groups(policy: PoolPolicy, target: Target) -> list[ObjectGroup]:
    """The groups every bundle has: scheduling, node pools, runtime, monitoring."""
    return [
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
            (
                *service_accounts(policy),
                *policy_config_map(policy),
                *tuner(policy),
                tuner_network_policy(policy),
            ),
        ),
        ObjectGroup(
            MONITORING, "monitoring", (*monitoring_objects(policy), flex_pod_monitor(policy))
        ),
    ]


def _production_groups(policy: PoolPolicy) -> list[ObjectGroup]:
    """The production HPAs' group, where some production workload scales on GPU use."""
    hpas = production_autoscalers(policy)
    return [ObjectGroup(PRODUCTION, "production", tuple(hpas))] if hpas else []


def _workload_groups(
    policy: PoolPolicy, stack: StackOptions, vllm_args: Mapping[str, Sequence[str]]
) -> list[ObjectGroup]:
    """One group per flex workload: its objects and the network policy that admits its
    clients (the Gateway's namespace where the inference extension routes to it)."""
    mode = stack.serving.mode
    served = mode != "off"
    gateway = policy.serving.gateway.namespace if policy.serving is not None else None
    clients = (gateway,) if gateway is not None and mode == "inference-extension" else ()
    return [
        ObjectGroup(
            INFERENCE_WORKLOAD,
            w.name,
            (
                *flex_workload(
                    policy,
                    w,
                    vllm_args[w.name],
                    stack,
                    pod_labels=flex_pod_labels(policy, w) if served else {},
                ),
                flex_network_policy(policy, w, clients),
            ),
        )
        for w in policy.workloads
    ]


def _serving_groups(policy: PoolPolicy, serving: ServingOptions) -> list[ObjectGroup]:
    """The serving layer's groups for the stack's ``gpupool:serving`` mode."""
    return [
        ObjectGroup(SERVING[serving.mode], name, tuple(objects))
        for name, objects in serving_groups(policy, serving)
    ]


def build_groups(
    policy: PoolPolicy,
    *,
    stack: StackOptions,
    vllm_args: Mapping[str, Sequence[str]],
) -> list[ObjectGroup]:
    """Every object, grouped; ``stack`` is the stack's options (docs/infra.md "Pulumi",
    docs/serving.md); ``vllm_args`` maps workload name -> the vLLM container args."""
    missing = [w.name for w in policy.workloads if w.name not in vllm_args]
    if missing:
        raise MissingVllmArgs(f"no vLLM arguments for workloads {missing}")
    groups = [
        *_system_groups(policy, stack.target),
        *_production_groups(policy),
        *_workload_groups(policy, stack, vllm_args),
        *_serving_groups(policy, stack.serving),
    ]
    groups = [replace(g, objects=tuple(map(retained, g.objects))) for g in groups]
    check_unique(groups)
    return groups


def build_bundle(
    policy: PoolPolicy,
    *,
    stack: StackOptions,
    vllm_args: Mapping[str, Sequence[str]],
) -> list[Manifest]:
    """Every object the policy implies, flat, in apply order."""
    groups = build_groups(policy, stack=stack, vllm_args=vllm_args)
    return [obj for group in groups for obj in group.objects]
