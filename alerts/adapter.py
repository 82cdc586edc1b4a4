"""prometheus-adapter rules that serve each workload's GPU budget as an External metric.

The flex HPA asks for External metric ``gpupool_flex_gpu_budget`` with selector
``{workload: <name>}`` and target ``AverageValue = gpus_per_replica``, so its desired replicas
are ``ceil(budget / gpus_per_replica)``. The recorded series has no ``namespace`` label (the
budget is a cluster-wide decision), hence ``namespaced: false``.
"""

from __future__ import annotations

from typing import Any

from runtime.metrics.catalogue import BUDGET_LABEL, FLEX_GPU_BUDGET, HPA_METRIC


def adapter_config() -> dict[str, Any]:
    """The adapter's ``config.yaml`` (only ``externalRules``)."""
    return {
        "externalRules": [
            {
                "seriesQuery": f'{FLEX_GPU_BUDGET}{{{BUDGET_LABEL}!=""}}',
                "resources": {"namespaced": False},
                "name": {"matches": f"^{FLEX_GPU_BUDGET}$", "as": HPA_METRIC},
                "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
            }
        ]
    }
