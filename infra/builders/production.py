"""What the owner's production workloads need to take GPUs back from flex (pure).

One builder, ``pod_patch``, says what every production pod template gets:

- ``priorityClassName`` = ``priorities.production`` (it preempts flex pods, priority -1);
- a toleration of every tainted gpupool pool's taint (``nodepools.pool_taint``: the flex
  pools, and the prod pool itself when it is tainted) and of the common ``nvidia.com/gpu``
  taint, as the flex pods have;
- ``affinity.nodeAffinity``: REQUIRED to be on a gpupool pool (prod or flex, by the pool
  label) and PREFERRED (weight 100) on the prod pool, so production fills the prod pool
  first and lands on flex only when it must.

Two renderings of that one patch, with the same result on the same object (tested):

- ``kustomize_component``: a Kustomize ``Component`` for owners who build their manifests
  with Kustomize (``components: [.../_production]``). Per reference, a strategic-merge patch
  sets ``priorityClassName`` and ``nodeAffinity`` and a JSON 6902 patch appends each
  toleration, because a strategic merge would replace the whole ``tolerations`` list (it has
  no merge key) and drop the owner's own tolerations.
- ``patch_object``: the same on an object dict, which ``infra.production_patch`` applies as a
  Pulumi transformation for stacks that declare the production workloads in Pulumi.

``affinity.nodeAffinity`` is replaced as a whole in both (podAffinity and podAntiAffinity
are kept); an owner's own node constraint belongs in ``nodeSelector``, which the scheduler
ANDs with it.

With ``scale_on: gpu_utilization`` the workload also gets an autoscaling/v2 HPA on the Pods
metric ``GPU_UTILIZATION_METRIC``, which prometheus-adapter serves with
``production_adapter_rules`` from dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from infra.builders.meta import Manifest, metadata
from infra.builders.nodepools import GPU_RESOURCE, TAINT_EFFECT, pool_taint
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


def production_tolerations(policy: PoolPolicy) -> list[Manifest]:
    """Tolerations of every tainted gpupool pool (prod first, then flex) and of the GPU taint."""
    tolerations: list[Manifest] = [
        {"operator": "Equal", **pool_taint(policy, pool)}
        for pool in [policy.prod_pool, *policy.flex_pools]
        if pool.taint
    ]
    tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": TAINT_EFFECT})
    return tolerations


def production_node_affinity(policy: PoolPolicy) -> Manifest:
    """Required: a gpupool pool (prod or flex). Preferred, weight 100: the prod pool."""
    label, prod = policy.cluster.pool_label, policy.prod_pool.name
    pools = [prod, *(p.name for p in policy.flex_pools)]
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": label, "operator": "In", "values": pools}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": PREFER_PROD_WEIGHT,
                "preference": {
                    "matchExpressions": [{"key": label, "operator": "In", "values": [prod]}]
                },
            }
        ],
    }


def pod_patch(policy: PoolPolicy) -> Manifest:
    """What every production pod template's ``spec`` gets (the same for every reference)."""
    return {
        "priorityClassName": policy.priorities.production.name,
        "tolerations": production_tolerations(policy),
        "affinity": {"nodeAffinity": production_node_affinity(policy)},
    }


def patched_pod_spec(policy: PoolPolicy, pod_spec: Mapping[str, Any]) -> Manifest:
    """``pod_spec`` with ``pod_patch`` applied: the priority class set, the tolerations
    appended (each once), ``affinity.nodeAffinity`` replaced, everything else kept."""
    patch = pod_patch(policy)
    out = copy.deepcopy(dict(pod_spec))
    out["priorityClassName"] = patch["priorityClassName"]
    tolerations = list(out.get("tolerations") or [])
    out["tolerations"] = tolerations + [t for t in patch["tolerations"] if t not in tolerations]
    out["affinity"] = dict(out.get("affinity") or {}) | patch["affinity"]
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
    target: Manifest = {
        "group": "apps",
        "version": "v1",
        "kind": workload.kind,
        "namespace": "|".join(namespaces),
    }
    if workload.name is not None:
        target["name"] = workload.name
    else:
        target["labelSelector"] = workload.label_selector
    return target


def kustomize_patches(policy: PoolPolicy, workload: ProductionWorkload) -> list[Manifest]:
    """Two ``patches:`` entries for one reference: strategic merge, then JSON 6902."""
    patch = pod_patch(policy)
    merge = {
        "apiVersion": _WORKLOAD_APIS[workload.kind],
        "kind": workload.kind,
        # Ignored with a target (Kustomize patches every object the target selects).
        "metadata": {"name": workload.name or "gpupool-production"},
        "spec": {
            "template": {
                "spec": {
                    "priorityClassName": patch["priorityClassName"],
                    "affinity": patch["affinity"],
                }
            }
        },
    }
    append = [
        {"op": "add", "path": "/spec/template/spec/tolerations/-", "value": toleration}
        for toleration in patch["tolerations"]
    ]
    target = kustomize_target(workload)
    return [
        {"target": target, "patch": to_yaml(merge, sort_keys=True)},
        {"target": dict(target), "patch": to_yaml(append, sort_keys=True)},
    ]


def kustomize_component(policy: PoolPolicy) -> Manifest | None:
    """The Kustomize Component patching every production reference; None without any."""
    if not policy.production:
        return None
    return {
        "apiVersion": KUSTOMIZE_COMPONENT_API,
        "kind": "Component",
        "patches": [p for w in policy.production for p in kustomize_patches(policy, w)],
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
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(
            workload.name, COMPONENT, namespace=workload.namespace, instance=workload.name
        ),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": _WORKLOAD_APIS[workload.kind],
                "kind": workload.kind,
                "name": workload.name,
            },
            "minReplicas": workload.min_replicas,
            "maxReplicas": workload.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": GPU_UTILIZATION_METRIC},
                        "target": {"type": "AverageValue", "averageValue": f"{milli}m"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": workload.scale_up_stabilization_s,
                    "selectPolicy": "Max",
                    "policies": [
                        {
                            "type": "Percent",
                            "value": SCALE_UP_PERCENT,
                            "periodSeconds": SCALE_UP_PERIOD_S,
                        },
                        {
                            "type": "Pods",
                            "value": SCALE_UP_PODS,
                            "periodSeconds": SCALE_UP_PERIOD_S,
                        },
                    ],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": workload.scale_down_stabilization_s,
                    "selectPolicy": "Max",
                    "policies": [
                        {
                            "type": "Pods",
                            "value": SCALE_DOWN_PODS,
                            "periodSeconds": SCALE_DOWN_PERIOD_S,
                        }
                    ],
                },
            },
        },
    }


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
