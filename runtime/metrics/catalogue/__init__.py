"""The one catalogue of named PromQL queries, built from the policy.

Every entry becomes a ``gpupool:...`` recording rule; alerts, the flex HPA (through
prometheus-adapter), the tuner and the dashboard read the recorded series, so a threshold or
label name changes in one place: the policy. The flex budget is a chain of such rules, one
per term (``TERMS``, in evaluation order), each reading the terms before it, so a policy
change rewrites the one term that reads it; every other ``expr`` reads raw exporter series
only. ``query()`` is standalone either way (the chain's recorded series inlined), so the
tuner can run it on backfilled data that no rule ever evaluated:
``build_catalogue(policy).query(KV_CACHE_HIT_RATE)``.

The queries sit in one module per concern (``budget``, ``gpus``, ``capacity``,
``evictions``, ``kv_cache``, ``serving``, ``snapshots``; docs/design/catalogue.md), each
naming beside every query the policy fields it reads (``knobs``); ``listing`` puts them in
catalogue order, ``names`` holds the recorded series' names, ``promql`` the fragments
several concerns share, ``sources`` the exporters they read.

Sources of the series names: dcgm-exporter (NVIDIA/dcgm-exporter, its default counters in
``default-counters.csv``: GPU utilization with the pod holding each GPU, framebuffer),
kube-state-metrics (kubernetes/kube-state-metrics: node labels and allocatable GPUs, pod
phases, GPU requests, priority classes, deletion marks and disruption reasons, deployment
replicas), vLLM's own ``/metrics`` (vllm-project/vllm 0.32) and, with
``kv_cache.kv_preservation: filesystem``, the snapshot GC sidecar of each flex pod
(``gpupool_kv_tier_*``, runtime/kvcache/preservation/gc.py; absent otherwise, so its queries
record nothing there). The flex budget (``budget.BudgetChain.chain``) is
mirrored in Python by ``runtime.sim.budget`` for the what-if engine; change both together.
Flex evictions come from ``runtime.metrics.evictions`` (``kube_pod_status_reason`` and, on
kube-state-metrics >= 2.20, ``kube_pod_status_disruption_reason``; docs/alerts.md says what
each version sees).

This package's names are its public API: importers use ``runtime.metrics.catalogue``.
"""

from runtime.metrics.catalogue.budget import HPA_TOLERANCE, TERMS, Term
from runtime.metrics.catalogue.listing import Catalogue, build_catalogue
from runtime.metrics.catalogue.names import (
    BUDGET_LABEL,
    CLUSTER_GPU_UTILIZATION,
    FLEX_BUDGET_STEP,
    FLEX_EVICTIONS,
    FLEX_GPU_BUDGET,
    FLEX_GROW_GPUS,
    FLEX_HEADROOM_GPUS,
    FLEX_HELD_GPUS,
    FLEX_HPA_AT_MAX,
    FLEX_HPA_STEP_GPUS,
    FLEX_PENDING_GPUS,
    FLEX_PODS_RUNNING,
    FLEX_SHED_GPUS,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    HPA_METRIC,
    KV_CACHE_HIT_RATE,
    KV_CACHE_USAGE,
    KV_TIER_DELETIONS,
    KV_TIER_FILL,
    NODE_UNALLOCATED_GPUS,
    POOL_GPU_UTILIZATION,
    PROD_PODS_PENDING,
    PRODUCTION_BUSY_GPUS,
    PRODUCTION_GPU_UTILIZATION,
    PRODUCTION_GPUS_DEMANDED,
    PRODUCTION_PENDING_GPUS,
    PROMPT_TOKENS_FROM_TIER,
    RESERVED_GPUS,
    SCHEDULABLE_GPUS,
    SPARE_GPUS,
    UNALLOCATED_GPUS,
    VLLM_PREEMPTIONS,
    VLLM_QUEUE_DEPTH,
    VLLM_START_TIME,
)
from runtime.metrics.catalogue.promql import ksm_label, num
from runtime.metrics.catalogue.query import Query, Requirement, Source

__all__ = [
    "BUDGET_LABEL",
    "CLUSTER_GPU_UTILIZATION",
    "FLEX_BUDGET_STEP",
    "FLEX_EVICTIONS",
    "FLEX_GPU_BUDGET",
    "FLEX_GROW_GPUS",
    "FLEX_HEADROOM_GPUS",
    "FLEX_HELD_GPUS",
    "FLEX_HPA_AT_MAX",
    "FLEX_HPA_STEP_GPUS",
    "FLEX_PENDING_GPUS",
    "FLEX_PODS_RUNNING",
    "FLEX_SHED_GPUS",
    "GPU_MEMORY_USED",
    "GPU_UTILIZATION",
    "HPA_METRIC",
    "HPA_TOLERANCE",
    "KV_CACHE_HIT_RATE",
    "KV_CACHE_USAGE",
    "KV_TIER_DELETIONS",
    "KV_TIER_FILL",
    "NODE_UNALLOCATED_GPUS",
    "POOL_GPU_UTILIZATION",
    "PRODUCTION_BUSY_GPUS",
    "PRODUCTION_GPUS_DEMANDED",
    "PRODUCTION_GPU_UTILIZATION",
    "PRODUCTION_PENDING_GPUS",
    "PROD_PODS_PENDING",
    "PROMPT_TOKENS_FROM_TIER",
    "RESERVED_GPUS",
    "SCHEDULABLE_GPUS",
    "SPARE_GPUS",
    "TERMS",
    "UNALLOCATED_GPUS",
    "VLLM_PREEMPTIONS",
    "VLLM_QUEUE_DEPTH",
    "VLLM_START_TIME",
    "Catalogue",
    "Query",
    "Requirement",
    "Source",
    "Term",
    "build_catalogue",
    "ksm_label",
    "num",
]
