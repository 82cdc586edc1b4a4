"""KV-cache alerts: a low prefix hit rate on a flex instance means fragmentation or small KV."""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import KV_CACHE_HIT_RATE, Catalogue, num


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.kv_hit_rate
    window = policy.metrics.rate_window
    return [
        group(
            "gpupool.kv-cache",
            policy,
            [
                # The recorded hit rate is absent where an instance had no prefix queries, so
                # an idle instance never fires.
                alert(
                    "KVCacheHitRateLow",
                    f"{KV_CACHE_HIT_RATE} < {num(knobs.min)}",
                    knobs,
                    summary="A flex vLLM instance's KV prefix-cache hit rate is low.",
                    description=(
                        "Prefix-cache hit rate of {{ $labels.pod }} (workload "
                        "{{ $labels.workload }}, namespace {{ $labels.namespace }}) is "
                        f"{{{{ $value | humanizePercentage }}}} over {window} (minimum "
                        f"{knobs.min:.0%} for {knobs.for_}): compact the KV cache or add "
                        "KV capacity."
                    ),
                    tuner_trigger=True,
                )
            ],
        )
    ]
