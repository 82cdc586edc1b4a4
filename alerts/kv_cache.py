"""KV-cache alerts: a low prefix hit rate on a flex instance means fragmentation or small KV.

A replica starts with an empty prefix cache, so its hit rate is low for reasons neither
compaction nor more KV would fix: the alert waits ``kv_hit_rate.warmup`` after the instance's
vLLM API server process started (``gpupool:vllm_start_time:seconds``). Where that series is
missing nothing is suppressed, so the alert then behaves exactly as it did without a warm-up.
"""

from __future__ import annotations

from alerts.rules import Group, alert, group
from policy.base import duration_seconds
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import KV_CACHE_HIT_RATE, VLLM_START_TIME, Catalogue, num


def warming_up(policy: PoolPolicy, started: str = VLLM_START_TIME) -> str:
    """Instances whose vLLM process started less than ``kv_hit_rate.warmup`` ago (value: their
    age in seconds). ``started`` is the start-time series, the recorded one by default; the
    catalogue's standalone query of it gives the same answer on raw data."""
    warmup = duration_seconds(policy.alerting.thresholds.kv_hit_rate.warmup)
    return f"(time() - {started}) < {num(warmup)}"


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    knobs = policy.alerting.thresholds.kv_hit_rate
    window = policy.metrics.rate_window
    by = ", ".join(policy.metrics.instance_labels)
    return [
        group(
            "gpupool.kv-cache",
            policy,
            [
                # The recorded hit rate is absent where an instance had no prefix queries, so
                # an idle instance never fires. ``unless`` drops instances still warming up;
                # without a start time the right side is empty and drops nothing.
                alert(
                    "KVCacheHitRateLow",
                    f"({KV_CACHE_HIT_RATE} < {num(knobs.min)})"
                    f" unless on ({by}) ({warming_up(policy)})",
                    knobs,
                    summary="A flex vLLM instance's KV prefix-cache hit rate is low.",
                    description=(
                        "Prefix-cache hit rate of {{ $labels.pod }} (workload "
                        "{{ $labels.workload }}, namespace {{ $labels.namespace }}) is "
                        f"{{{{ $value | humanizePercentage }}}} over {window} (minimum "
                        f"{knobs.min:.0%} for {knobs.for_}, counted after a {knobs.warmup} "
                        "warm-up from the vLLM process start): compact the KV cache or add "
                        "KV capacity."
                    ),
                    tuner_trigger=True,
                )
            ],
        )
    ]
