"""What the owner's production workloads need to take GPUs back from flex (pure).

What every production pod template gets, merged with what it has (``patched_pod_spec``):

- ``priorityClassName`` = ``priorities.production`` (it preempts flex pods, priority -1);
- ``pool_toleration`` (``<pool_label> Exists``: every gpupool pool's taint), replacing the
  pod's own toleration of that key, and ``GPU_TOLERATION`` (``nvidia.com/gpu``), as the flex
  pods have; the pod's other tolerations are kept;
- ``merged_node_affinity``: every required term also REQUIRES a gpupool pool (prod or flex,
  by the pool label), and the weight-100 preferred term PREFERS the prod pool, so production
  fills the prod pool first and lands on flex only when it must; the pod's own terms, and
  podAffinity/podAntiAffinity, are kept.

Two renderings of that one patch, with the same result on the same object (tested with
``kubectl kustomize`` on Deployments and StatefulSets with and without those lists):

- ``kustomize_component``: a Kustomize ``Component`` for owners who build their manifests
  with Kustomize (``components: [.../_production]``). A strategic merge replaces lists that
  have no merge key (tolerations, node selector terms) and a JSON 6902 append needs the list
  to exist, so the merges are ``replacements`` with ``create`` from a ``local-config`` values
  object (``kustomize_replacements``, in the nested ``lists/`` Component, which runs first);
  then patches set the priority class and append the GPU toleration.
- ``patch_object``: the same on an object dict, which ``infra.production_patch`` applies as a
  Pulumi transformation for stacks that declare the production workloads in Pulumi.

With ``scale_on: gpu_utilization`` the workload also gets an autoscaling/v2 HPA on the Pods
metric ``GPU_UTILIZATION_METRIC``, which prometheus-adapter serves with
``production_adapter_rules`` from dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from infra.builders.hpa import horizontal_pod_autoscaler, rate_limit, scaling_rule
from infra.builders.meta import Manifest, metadata
from infra.builders.nodepools import GPU_RESOURCE, TAINT_EFFECT
from infra.yaml_text import to_yaml
from policy import PoolPolicy
from policy.production import ProductionWorkload

COMPONENT = "production"
"""``app.kubernetes.io/component`` of the objects gpupool renders for production workloads."""

PREFER_PROD_WEIGHT = 100
"""Weight of the preferred node affinity on the prod pool (the largest allowed)."""

KUSTOMIZE_COMPONENT_API = "kustomize.config.k8s.io/v1alpha1"
"""``apiVersion`` of a Kustomize ``Component`` (kustomize >= 3.7, kubectl >= 1.21)."""

UNSET_NAMESPACE = "default"
"""Namespace Kustomize gives an object without ``metadata.namespace`` when it matches a
patch target. A kustomization's own ``namespace:`` is applied after its components, so the
targets accept it too (``<namespace>|default``): without it a component listed beside
``namespace: inference`` would match nothing, silently."""

GPU_UTILIZATION_METRIC = "gpupool_pod_gpu_utilization"
"""Pods metric (custom.metrics.k8s.io) the production HPAs scale on: mean GPU duty cycle
(0-1) of one pod's GPUs."""

DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""dcgm-exporter's GPU utilization gauge, in percent (NVIDIA/dcgm-exporter's default counters,
``default-counters.csv``)."""

SCALE_UP_PERIOD_S = 15
"""Period of the production scale-up policies (Kubernetes' default scale-up behaviour)."""

SCALE_UP_PERCENT = 100
"""Scale-up may double the replicas every ``SCALE_UP_PERIOD_S``..."""

SCALE_UP_PODS = 4
"""...or add this many, whichever is more (``selectPolicy: Max``)."""

SCALE_DOWN_PERIOD_S = 120
"""Period of the production scale-down policy."""

SCALE_DOWN_PODS = 1
"""Scale-down removes at most one replica every ``SCALE_DOWN_PERIOD_S``."""

_WORKLOAD_APIS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1"}
"""``apiVersion`` of each kind a production reference may name."""

LISTS_DIR = "lists"
"""Nested Component that merges into the pod's lists (``kustomize_replacements``)."""

VALUES_FILE = "values.yaml"
VALUES_API = "gpupool.io/v1"
VALUES_KIND = "ProductionPatchValues"
VALUES_NAME = "gpupool-production"
"""The values object the replacements copy from (never applied: ``LOCAL_CONFIG``)."""

LOCAL_CONFIG = "config.kubernetes.io/local-config"
"""Annotation that keeps an object out of ``kustomize build``'s output."""

_NODE_AFFINITY = "spec.template.spec.affinity.nodeAffinity"


def pool_toleration(policy: PoolPolicy) -> Manifest:
    """``<pool_label> Exists``, ``NoSchedule``: every gpupool pool's taint, whichever pools
    are tainted (``nodepools.pool_taint``; only gpupool taints with its pool label)."""
    return {"key": policy.cluster.pool_label, "operator": "Exists", "effect": TAINT_EFFECT}


GPU_TOLERATION: Manifest = {"key": GPU_RESOURCE, "operator": "Exists", "effect": TAINT_EFFECT}
"""The common ``nvidia.com/gpu`` taint's toleration, as the flex pods have it."""


def required_expression(policy: PoolPolicy) -> Manifest:
    """REQUIRED of every production pod: ``<pool_label> In [prod, flex...]``."""
    pools = [policy.prod_pool.name, *(p.name for p in policy.flex_pools)]
    return {"key": policy.cluster.pool_label, "operator": "In", "values": pools}


def preferred_expression(policy: PoolPolicy) -> Manifest:
    """PREFERRED (weight ``PREFER_PROD_WEIGHT``): ``<pool_label> In [prod]``."""
    return {"key": policy.cluster.pool_label, "operator": "In", "values": [policy.prod_pool.name]}


def _keyed(items: list[Any], field: str, value: object, new: Manifest) -> list[Any]:
    """``items`` with the first element whose ``field`` is ``value`` replaced by ``new``, else
    ``new`` appended: what Kustomize does for a ``[field=value]`` path with ``create``."""
    out = list(items)
    for i, item in enumerate(out):
        if isinstance(item, Mapping) and str(item.get(field)) == str(value):
            out[i] = new
            return out
    return [*out, new]


def merged_node_affinity(policy: PoolPolicy, node_affinity: Mapping[str, Any]) -> Manifest:
    """``node_affinity`` with gpupool's terms merged in, the owner's kept.

    Required: every ``nodeSelectorTerms`` entry (they are ORed) gets the pool expression
    (ANDed inside a term), replacing an expression of its own on the pool label; no term:
    one term with the pool expression. Preferred: the term of weight ``PREFER_PROD_WEIGHT``
    gets the prod-pool expression the same way; no such term: one is appended.
    """
    out = copy.deepcopy(dict(node_affinity))
    label = policy.cluster.pool_label
    required = dict(out.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t or {}) for t in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchExpressions"] = _keyed(
            term.get("matchExpressions") or [], "key", label, required_expression(policy)
        )
    out["requiredDuringSchedulingIgnoredDuringExecution"] = required | {"nodeSelectorTerms": terms}
    preferred = [dict(t) for t in out.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    ours = next((t for t in preferred if str(t.get("weight")) == str(PREFER_PROD_WEIGHT)), None)
    if ours is None:
        ours = {"weight": PREFER_PROD_WEIGHT}
        preferred.append(ours)
    preference = dict(ours.get("preference") or {})
    preference["matchExpressions"] = _keyed(
        preference.get("matchExpressions") or [], "key", label, preferred_expression(policy)
    )
    ours |= {"weight": PREFER_PROD_WEIGHT, "preference": preference}
    out["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return out


def patched_pod_spec(policy: PoolPolicy, pod_spec: Mapping[str, Any]) -> Manifest:
    """``pod_spec`` with the production patch, the owner's fields kept: the priority class set;
    the owner's toleration of the pool label replaced by ``pool_toleration`` (else it is
    appended), then ``GPU_TOLERATION`` appended; ``merged_node_affinity``."""
    out = copy.deepcopy(dict(pod_spec))
    out["priorityClassName"] = policy.priorities.production.name
    tolerations = _keyed(
        out.get("tolerations") or [], "key", policy.cluster.pool_label, pool_toleration(policy)
    )
    out["tolerations"] = [*tolerations, dict(GPU_TOLERATION)]
    affinity = dict(out.get("affinity") or {})
    affinity["nodeAffinity"] = merged_node_affinity(policy, affinity.get("nodeAffinity") or {})
    out["affinity"] = affinity
    return out


def targets(
    workload: ProductionWorkload,
    obj: Mapping[str, Any],
    *,
    default_namespace: str = UNSET_NAMESPACE,
) -> bool:
    """``obj`` (a Deployment/StatefulSet dict) is an object ``workload`` refers to.

    ``default_namespace``: the namespace an object without ``metadata.namespace`` ends up in.
    """
    meta = obj.get("metadata") or {}
    if obj.get("kind") != workload.kind or obj.get("apiVersion") != _WORKLOAD_APIS[workload.kind]:
        return False
    if (meta.get("namespace") or default_namespace) != workload.namespace:
        return False
    if workload.name is not None:
        return bool(meta.get("name") == workload.name)
    labels = meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in (workload.selector or {}).items())


def patch_object(
    policy: PoolPolicy, obj: Mapping[str, Any], *, default_namespace: str = UNSET_NAMESPACE
) -> Manifest | None:
    """A patched copy of ``obj`` when a production reference targets it, else None."""
    if not any(targets(w, obj, default_namespace=default_namespace) for w in policy.production):
        return None
    out = copy.deepcopy(dict(obj))
    template = out.setdefault("spec", {}).setdefault("template", {})
    template["spec"] = patched_pod_spec(policy, template.get("spec") or {})
    return out


def kustomize_target(workload: ProductionWorkload) -> Manifest:
    """The Kustomize patch ``target`` of one reference (its fields are anchored regexes)."""
    namespaces = dict.fromkeys([workload.namespace, UNSET_NAMESPACE])
    return _selector(workload) | {"namespace": "|".join(namespaces)}


def kustomize_selects(workload: ProductionWorkload) -> list[Manifest]:
    """The replacement ``select``s of one reference: one per namespace it may have while the
    Component runs (replacements match exact values, not regexes)."""
    namespaces = dict.fromkeys([workload.namespace, UNSET_NAMESPACE])
    return [{"select": _selector(workload) | {"namespace": ns}} for ns in namespaces]


def _selector(workload: ProductionWorkload) -> Manifest:
    out: Manifest = {"group": "apps", "version": "v1", "kind": workload.kind}
    if workload.name is not None:
        out["name"] = workload.name
    else:
        out["labelSelector"] = workload.label_selector
    return out


def kustomize_patches(policy: PoolPolicy, workload: ProductionWorkload) -> list[Manifest]:
    """The top Component's two ``patches:`` entries for one reference: a strategic merge
    setting ``priorityClassName``, then a JSON 6902 append of ``GPU_TOLERATION`` (the
    ``lists`` Component has made sure the list exists)."""
    merge = {
        "apiVersion": _WORKLOAD_APIS[workload.kind],
        "kind": workload.kind,
        # Ignored with a target (Kustomize patches every object the target selects).
        "metadata": {"name": workload.name or "gpupool-production"},
        "spec": {"template": {"spec": {"priorityClassName": policy.priorities.production.name}}},
    }
    append = [{"op": "add", "path": "/spec/template/spec/tolerations/-", "value": GPU_TOLERATION}]
    target = kustomize_target(workload)
    return [
        {"target": target, "patch": to_yaml(merge, sort_keys=True)},
        {"target": dict(target), "patch": to_yaml(append, sort_keys=True)},
    ]


def kustomize_values(policy: PoolPolicy) -> Manifest:
    """The ``lists`` Component's one resource: the values its replacements copy. Kustomize
    leaves a ``local-config`` object out of the build's output."""
    return {
        "apiVersion": VALUES_API,
        "kind": VALUES_KIND,
        "metadata": {"name": VALUES_NAME, "annotations": {LOCAL_CONFIG: "true"}},
        "toleration": pool_toleration(policy),
        "required": required_expression(policy),
        "preferred": preferred_expression(policy),
        "weight": PREFER_PROD_WEIGHT,
    }


def kustomize_replacements(policy: PoolPolicy) -> list[Manifest]:
    """The ``lists`` Component's ``replacements:``, in order: ``[field=value]`` paths with
    ``create`` replace the element they find or append one, creating the lists, which a
    strategic merge (it replaces lists without a merge key) and a JSON 6902 append (it needs
    the list) cannot. The required term ``0`` first makes sure one term exists, then ``*``
    reaches every term (``merged_node_affinity``)."""
    label = policy.cluster.pool_label
    selects = [s for w in policy.production for s in kustomize_selects(w)]
    terms = f"{_NODE_AFFINITY}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    preferred = (
        f"{_NODE_AFFINITY}.preferredDuringSchedulingIgnoredDuringExecution"
        f".[weight={PREFER_PROD_WEIGHT}]"
    )
    copies = {
        "toleration": [f"spec.template.spec.tolerations.[key={label}]"],
        "required": [
            f"{terms}.0.matchExpressions.[key={label}]",
            f"{terms}.*.matchExpressions.[key={label}]",
        ],
        "preferred": [f"{preferred}.preference.matchExpressions.[key={label}]"],
        # the element ``[weight=100]`` creates holds the string "100": set the number
        "weight": [f"{preferred}.weight"],
    }
    return [
        {
            "source": {"kind": VALUES_KIND, "name": VALUES_NAME, "fieldPath": field},
            "targets": [
                select | {"fieldPaths": paths, "options": {"create": True}} for select in selects
            ],
        }
        for field, paths in copies.items()
    ]


def kustomize_component(policy: PoolPolicy) -> dict[str, Manifest]:
    """The production Component's files (path under its folder -> document); none without a
    production reference. ``kustomization.yaml`` includes ``lists/`` (the values and the
    replacements, which run first) and then patches: the priority class and the GPU
    toleration."""
    if not policy.production:
        return {}
    return {
        "kustomization.yaml": {
            "apiVersion": KUSTOMIZE_COMPONENT_API,
            "kind": "Component",
            "components": [LISTS_DIR],
            "patches": [p for w in policy.production for p in kustomize_patches(policy, w)],
        },
        f"{LISTS_DIR}/kustomization.yaml": {
            "apiVersion": KUSTOMIZE_COMPONENT_API,
            "kind": "Component",
            "resources": [VALUES_FILE],
            "replacements": kustomize_replacements(policy),
        },
        f"{LISTS_DIR}/{VALUES_FILE}": kustomize_values(policy),
    }


def autoscaler(policy: PoolPolicy, workload: ProductionWorkload) -> Manifest:
    """autoscaling/v2 HPA on the pods' mean GPU duty cycle: fast up, slow down.

    Desired replicas = ``ceil(replicas * mean duty / target)`` (Kubernetes' Pods-metric rule),
    within ``min_replicas``..``max_replicas``. Scale-up may double or add
    ``SCALE_UP_PODS`` every ``SCALE_UP_PERIOD_S`` after ``scale_up_stabilization_s``;
    scale-down removes one replica every ``SCALE_DOWN_PERIOD_S`` after
    ``scale_down_stabilization_s``.
    """
    assert workload.name is not None and workload.target_gpu_utilization is not None
    milli = round(workload.target_gpu_utilization * 1000)
    duty_cycle = {
        "type": "Pods",
        "pods": {
            "metric": {"name": GPU_UTILIZATION_METRIC},
            "target": {"type": "AverageValue", "averageValue": f"{milli}m"},
        },
    }
    up = [
        rate_limit("Percent", SCALE_UP_PERCENT, SCALE_UP_PERIOD_S),
        rate_limit("Pods", SCALE_UP_PODS, SCALE_UP_PERIOD_S),
    ]
    down = [rate_limit("Pods", SCALE_DOWN_PODS, SCALE_DOWN_PERIOD_S)]
    return horizontal_pod_autoscaler(
        metadata(workload.name, COMPONENT, namespace=workload.namespace, instance=workload.name),
        {
            "apiVersion": _WORKLOAD_APIS[workload.kind],
            "kind": workload.kind,
            "name": workload.name,
        },
        (workload.min_replicas, workload.max_replicas),
        duty_cycle,
        scaling_rule(workload.scale_up_stabilization_s, up, {}),
        scaling_rule(workload.scale_down_stabilization_s, down, {}),
    )


def production_autoscalers(policy: PoolPolicy) -> list[Manifest]:
    """The HPAs gpupool renders: one per production workload with ``scale_on: gpu_utilization``."""
    return [autoscaler(policy, w) for w in policy.production if w.renders_hpa]


def production_adapter_rules(policy: PoolPolicy) -> dict[str, Any]:
    """prometheus-adapter ``rules`` (custom metrics) serving ``GPU_UTILIZATION_METRIC``.

    A fragment of the adapter's ``config.yaml`` (``{"rules": [...]}``, empty without a
    rendered HPA), beside the flex HPA's ``externalRules``. Per pod: the mean of
    ``DCGM_FI_DEV_GPU_UTIL / 100`` over the GPUs dcgm-exporter attributes to it, restricted
    to the namespaces of the rendered HPAs.
    """
    namespaces = sorted({w.namespace for w in policy.production if w.renders_hpa})
    if not namespaces:
        return {"rules": []}
    # dcgm-exporter's labels naming the pod that holds each GPU (``exported_*`` when the
    # scrape does not honour its labels): the same ones the catalogue joins on.
    ns, pod = policy.metrics.gpu_pod_labels
    return {
        "rules": [
            {
                "seriesQuery": f'{DCGM_GPU_UTIL}{{{ns}=~"{"|".join(namespaces)}",{pod}!=""}}',
                "resources": {
                    "overrides": {
                        ns: {"resource": "namespace"},
                        pod: {"resource": "pod"},
                    }
                },
                "name": {"matches": f"^{DCGM_GPU_UTIL}$", "as": GPU_UTILIZATION_METRIC},
                "metricsQuery": "avg by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>}) / 100",
            }
        ]
    }
