"""prometheus-adapter rules gpupool needs, as a FRAGMENT to merge into the cluster's adapter.

The flex HPA asks for External metric ``gpupool_flex_gpu_budget`` with selector
``{workload: <name>}`` and target ``AverageValue = gpus_per_replica``, so its desired replicas
are ``ceil(budget / gpus_per_replica)``. The recorded series has no ``namespace`` label (the
budget is a cluster-wide decision), hence ``namespaced: false``. Production HPAs with
``scale_on: gpu_utilization`` read the Pods metric of ``production_adapter_rules``.

A cluster runs ONE prometheus-adapter whose single ``config.yaml`` serves every custom and
external metric of the cluster, so gpupool never ships that file as an object (it would
replace the owner's rules): ``gpupool render`` writes the rules as files to merge
(``infra.render.adapter_documents``; docs/alerts.md "prometheus-adapter: merge the fragment").
"""

from __future__ import annotations

from typing import Any

from infra.builders.production import production_adapter_rules
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import BUDGET_LABEL, FLEX_GPU_BUDGET, HPA_METRIC


def external_rules() -> list[dict[str, Any]]:
    """The ``externalRules`` entries serving ``HPA_METRIC`` from ``FLEX_GPU_BUDGET``."""
    return [
        {
            "seriesQuery": f'{FLEX_GPU_BUDGET}{{{BUDGET_LABEL}!=""}}',
            "resources": {"namespaced": False},
            "name": {"matches": f"^{FLEX_GPU_BUDGET}$", "as": HPA_METRIC},
            "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }
    ]


def adapter_config() -> dict[str, Any]:
    """The flex budget's part of the adapter's ``config.yaml`` (only ``externalRules``)."""
    return {"externalRules": external_rules()}


def adapter_fragment(policy: PoolPolicy) -> dict[str, Any]:
    """Entries to append to the lists of the adapter's ``config.yaml``: ``externalRules``
    (flex budget) and, with production HPAs, ``rules`` (their Pods metric)."""
    fragment: dict[str, Any] = {}
    custom = production_adapter_rules(policy)["rules"]
    if custom:
        fragment["rules"] = custom
    fragment["externalRules"] = external_rules()
    return fragment


def helm_values(policy: PoolPolicy) -> dict[str, Any]:
    """The same entries as values of the prometheus-community ``prometheus-adapter`` chart,
    which renders ``rules.custom`` into ``rules`` and ``rules.external`` into
    ``externalRules`` of its ConfigMap."""
    fragment = adapter_fragment(policy)
    rules: dict[str, Any] = {}
    if "rules" in fragment:
        rules["custom"] = fragment["rules"]
    rules["external"] = fragment["externalRules"]
    return {"rules": rules}
