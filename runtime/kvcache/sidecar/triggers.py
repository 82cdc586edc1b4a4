"""What the compaction sidecar does next: a pure decision from two metric samples and the pool.

Triggers (thresholds from the policy), first match wins:
  * explicit shrink request (tuner or alert webhook) -> shrink to the requested size, raised to
    the shrink floor when it is below it;
  * on a shrunk pool, grow back to full size when requests or the cache need the room: the
    oldest waiting request lacks free blocks (the plugin's ``blocks_short``), requests were
    preempted since the last sample (``vllm:num_preemptions_total``: vLLM preempts only when a
    running request cannot get a block), or the prefix-cache hit rate since the last sample
    is below ``alerting.thresholds.kv_hit_rate.min``;
  * KV usage below ``kv_cache.compaction_usage_below`` and no compaction for
    ``kv_cache.compaction_min_interval`` -> compact and shrink to the shrink target (compact
    only when that would not shrink);
  * explicit compaction request (the tuner's low-hit-rate, low-usage rule) -> the same compact
    and shrink without the usage threshold (the tuner saw low usage over its windows), but
    still after the grow rule and still at most once per ``kv_cache.compaction_min_interval``
    (a deferred request is dropped, not kept: the tuner asks again while the condition holds).
    Saturation is the plugin's rule: it defers a compaction at or above
    ``kv_cache.page_table_max_usage`` (``limits.CompactionLimits``) or while the next waiting
    request lacks KV blocks (``in_vllm.saturation``).

Shrink target: the blocks requests hold plus the prefix cache kept (at most
``kv_cache.shrink_prefix_cache_share`` of the starting pool) fill
``kv_cache.shrink_target_usage`` of the pool, and never less than the floor: the blocks
requests hold plus one ``max_model_len`` sequence (and the null block), so a full-length
request can always start (``limits.shrink_floor``; the plugin refuses any shrink below it,
so a shrink raised to the floor from a status that is a poll old can still be refused when
requests took blocks since, and is retried at the next poll).
Fail closed: without a usable sample or plugin status nothing is done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from policy.base import duration_seconds
from policy.kvcache import KvCache
from runtime.kvcache import limits

Action = Literal["none", "compact", "shrink", "grow"]


@dataclass(frozen=True)
class InstanceSample:
    """One read of the instance's ``/metrics`` (counters are cumulative)."""

    at_s: float
    """Monotonic time of the read."""
    usage: float
    """``vllm:kv_cache_usage_perc`` (0-1, of the current pool; prefix-cached free blocks
    count as free)."""
    prefix_queries: float
    """``vllm:prefix_cache_queries_total`` (tokens)."""
    prefix_hits: float
    """``vllm:prefix_cache_hits_total`` (tokens)."""
    preemptions: float | None = None
    """``vllm:num_preemptions_total``; None when the page has no such series."""


@dataclass(frozen=True)
class PoolState:
    """The plugin's ``status`` reply, the part decisions need (block counts exclude block 0)."""

    usable_blocks: int
    """Blocks of the pool now (block 0, the null block, included)."""
    original_blocks: int
    """Blocks the engine started with: the most a grow restores."""
    occupied_blocks: int
    """Blocks held by requests or kept for prefix caching."""
    held_blocks: int
    """Blocks requests hold (reference count above 0); the rest of the occupied ones are
    prefix-cached only, and the scheduler evicts them whenever it needs a block."""
    max_model_len: int
    """Longest sequence in tokens the engine accepts."""
    block_size: int
    """Tokens per block."""
    blocks_short: int
    """Blocks the oldest waiting request lacks to be admitted now (0 when nothing waits or it
    fits): a wait that more blocks would end."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> PoolState:
        """The fields of a ``status`` reply; ValueError naming the first missing or
        non-integer one."""
        values: dict[str, int] = {}
        for name in (f.name for f in fields(cls)):
            value = status.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"plugin status: {name} is {value!r}, expected an integer")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class Decision:
    """What to ask the plugin for, and why (the reason goes to logs and metrics)."""

    action: Action
    reason: str
    num_blocks: int | None = None


def _increase(previous: float | None, current: float | None) -> float | None:
    """Growth of a cumulative counter between two samples; None without both or on a reset."""
    if previous is None or current is None or current < previous:
        return None
    return current - previous


def hit_rate(previous: InstanceSample | None, current: InstanceSample) -> float | None:
    """Prefix-cache hit rate between two samples; None without queries (or a counter reset)."""
    if previous is None:
        return None
    queries = _increase(previous.prefix_queries, current.prefix_queries)
    hits = _increase(previous.prefix_hits, current.prefix_hits)
    if not queries or hits is None:
        return None
    return hits / queries


def preemptions_since(previous: InstanceSample | None, current: InstanceSample) -> float | None:
    """Requests preempted between two samples; None without both counters (or on a reset)."""
    if previous is None:
        return None
    return _increase(previous.preemptions, current.preemptions)


def shrink_target(blocks: int, target_usage: float) -> int:
    """Pool size at which ``blocks`` fill ``target_usage`` (block 0 included)."""
    return max(2, math.ceil(blocks / target_usage) + 1)


def kept_cache(pool: PoolState, share: float) -> int:
    """Prefix-cached blocks a shrink target counts: all of them up to ``share`` of the pool
    the engine started with."""
    return min(pool.occupied_blocks - pool.held_blocks, math.floor(share * pool.original_blocks))


def shrink_floor(pool: PoolState) -> int:
    """Smallest pool a shrink may leave (``limits.shrink_floor``, the rule the plugin also
    enforces): the blocks requests hold, one ``max_model_len`` sequence and the null block."""
    return limits.shrink_floor(
        held_blocks=pool.held_blocks, max_model_len=pool.max_model_len, block_size=pool.block_size
    )


def planned_size(pool: PoolState, kv: KvCache) -> int:
    """The shrink target (module docstring): held blocks and the kept cache fill
    ``kv.shrink_target_usage``, at least the floor."""
    held_and_cache = pool.held_blocks + kept_cache(pool, kv.shrink_prefix_cache_share)
    return max(shrink_target(held_and_cache, kv.shrink_target_usage), shrink_floor(pool))


def grow_reason(
    previous: InstanceSample | None,
    current: InstanceSample,
    pool: PoolState,
    hit_rate_min: float,
) -> str | None:
    """Why a shrunk pool must grow back now, or None (also on a pool at full size)."""
    if pool.usable_blocks >= pool.original_blocks:
        return None
    if pool.blocks_short > 0:
        return f"the oldest waiting request lacks {pool.blocks_short} blocks on a shrunk pool"
    preempted = preemptions_since(previous, current)
    if preempted:
        return f"{preempted:g} requests preempted for lack of blocks on a shrunk pool"
    rate = hit_rate(previous, current)
    if rate is not None and rate < hit_rate_min:
        return f"prefix hit rate {rate:.2f} < {hit_rate_min:.2f} on a shrunk pool"
    return None


def _requested_shrink(requested: int, pool: PoolState) -> Decision:
    floor = shrink_floor(pool)
    asked = f"shrink to {requested} blocks requested"
    if requested >= floor:
        return Decision("shrink", asked, requested)
    why = f"the floor of {floor} blocks ({pool.held_blocks} held + one max_model_len sequence)"
    if floor >= pool.usable_blocks:
        return Decision("none", f"{asked}; {why} is not below the pool's {pool.usable_blocks}")
    return Decision("shrink", f"{asked}; raised to {why}", floor)


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
        return _requested_shrink(shrink_request, pool)
    grow = grow_reason(previous, current, pool, hit_rate_min)
    if grow is not None:
        return Decision("grow", grow, pool.original_blocks)
    if not compaction_request and current.usage >= kv.compaction_usage_below:
        return Decision("none", f"KV usage {current.usage:.2f} >= {kv.compaction_usage_below:.2f}")
    interval = duration_seconds(kv.compaction_min_interval)
    if last_compaction_at_s is not None and current.at_s - last_compaction_at_s < interval:
        return Decision("none", f"last compaction less than {kv.compaction_min_interval} ago")
    target = planned_size(pool, kv)
    reason = (
        "compaction requested by the tuner"
        if compaction_request
        else f"KV usage {current.usage:.2f} < {kv.compaction_usage_below:.2f}"
    )
    if target < pool.usable_blocks:
        return Decision("shrink", reason, target)
    return Decision("compact", reason)
