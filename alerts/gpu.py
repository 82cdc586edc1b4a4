"""GPU memory alerts: a framebuffer close to full leaves no room for KV growth or bursts."""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import GPU_MEMORY_USED, Catalogue, num


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.gpu_memory_pressure
    node = policy.metrics.gpu_node_label
    return [
        group(
            "gpupool.gpu",
            policy,
            [
                alert(
                    "GPUMemoryPressure",
                    f"{GPU_MEMORY_USED} > {num(knobs.max)}",
                    knobs,
                    summary="A GPU's memory is nearly full.",
                    description=(
                        f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.{node} }}}} has "
                        f"{{{{ $value | humanizePercentage }}}} of its memory in use "
                        f"(limit {knobs.max:.0%} for {knobs.for_}); KV cache and bursts "
                        "have no headroom left."
                    ),
                )
            ],
        )
    ]
