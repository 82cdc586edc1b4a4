"""What the compaction sidecar does next: a pure decision from two metric samples and the pool.

Triggers (thresholds from the policy):
  * explicit shrink request (tuner or alert webhook) -> shrink to the requested size;
  * prefix-cache hit rate since the last sample below ``alerting.thresholds.kv_hit_rate.min``
    while the pool is shrunk -> grow back to full size (the cache needs the room);
  * KV usage below ``kv_cache.compaction_usage_below`` and no compaction for
    ``kv_cache.compaction_min_interval`` -> compact and shrink so occupied blocks fill
    ``kv_cache.shrink_target_usage`` of the pool (compact only when that would not shrink);
  * explicit compaction request (the tuner's low-hit-rate, low-usage rule) -> the same compact
    and shrink without the usage threshold (the tuner saw low usage over its windows), but
    still after the grow rule and still at most once per ``kv_cache.compaction_min_interval``
    (a deferred request is dropped, not kept: the tuner asks again while the condition holds).
    Saturation is the plugin's rule: it defers a compaction at or above
    ``kv_cache.page_table_max_usage`` (``limits.CompactionLimits``).
Fail closed: without a usable sample nothing is done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from policy.base import duration_seconds
from policy.kvcache import KvCache

Action = Literal["none", "compact", "shrink", "grow"]


@dataclass(frozen=True)
class InstanceSample:
    """One read of the instance's ``/metrics`` (counters are cumulative)."""

    at_s: float
    """Monotonic time of the read."""
    usage: float
    """``vllm:kv_cache_usage_perc`` (0-1, of the current pool)."""
    prefix_queries: float
    """``vllm:prefix_cache_queries_total`` (tokens)."""
    prefix_hits: float
    """``vllm:prefix_cache_hits_total`` (tokens)."""


@dataclass(frozen=True)
class PoolState:
    """The plugin's ``status`` reply, the part decisions need."""

    usable_blocks: int
    original_blocks: int
    occupied_blocks: int


@dataclass(frozen=True)
class Decision:
    """What to ask the plugin for, and why (the reason goes to logs and metrics)."""

    action: Action
    reason: str
    num_blocks: int | None = None


def hit_rate(previous: InstanceSample | None, current: InstanceSample) -> float | None:
    """Prefix-cache hit rate between two samples; None without queries (or a counter reset)."""
    if previous is None:
        return None
    queries = current.prefix_queries - previous.prefix_queries
    hits = current.prefix_hits - previous.prefix_hits
    if queries <= 0 or hits < 0:
        return None
    return hits / queries


def shrink_target(occupied_blocks: int, target_usage: float) -> int:
    """Pool size at which ``occupied_blocks`` fill ``target_usage`` (block 0 included)."""
    return max(2, math.ceil(occupied_blocks / target_usage) + 1)


def decide(
    *,
    previous: InstanceSample | None,
    current: InstanceSample | None,
    pool: PoolState | None,
    kv: KvCache,
    hit_rate_min: float,
    last_compaction_at_s: float | None,
    shrink_request: int | None = None,
    compaction_request: bool = False,
) -> Decision:
    """The next action for one instance (see the module docstring for the rules)."""
    if current is None or pool is None:
        return Decision("none", "no metrics or no plugin status: fail closed")
    if shrink_request is not None:
        return Decision("shrink", f"shrink to {shrink_request} blocks requested", shrink_request)
    rate = hit_rate(previous, current)
    if rate is not None and rate < hit_rate_min and pool.usable_blocks < pool.original_blocks:
        return Decision(
            "grow",
            f"prefix hit rate {rate:.2f} < {hit_rate_min:.2f} on a shrunk pool",
            pool.original_blocks,
        )
    if not compaction_request and current.usage >= kv.compaction_usage_below:
        return Decision("none", f"KV usage {current.usage:.2f} >= {kv.compaction_usage_below:.2f}")
    interval = duration_seconds(kv.compaction_min_interval)
    if last_compaction_at_s is not None and current.at_s - last_compaction_at_s < interval:
        return Decision("none", f"last compaction less than {kv.compaction_min_interval} ago")
    target = shrink_target(pool.occupied_blocks, kv.shrink_target_usage)
    reason = (
        "compaction requested by the tuner"
        if compaction_request
        else f"KV usage {current.usage:.2f} < {kv.compaction_usage_below:.2f}"
    )
    if target < pool.usable_blocks:
        return Decision("shrink", reason, target)
    return Decision("compact", reason)
