"""The flex instances' KV cache (vLLM): use, prefix-cache hits, tier loads."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import (
    KV_CACHE_HIT_RATE,
    KV_CACHE_USAGE,
    PROMPT_TOKENS_FROM_TIER,
)
from runtime.metrics.catalogue.promql import Selectors, num
from runtime.metrics.catalogue.query import Query


class _KvCacheQueries(Selectors):
    """The KV-cache queries and the filter only they read."""

    def min_queried_tokens(self) -> str:
        """Filter on an instance's queried tokens per second: ``> 0`` (no division by zero)
        or at least the policy's minimum."""
        floor = self.policy.alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s
        return f">= {num(floor)}" if floor > 0 else "> 0"

    def queries(self) -> list[Query]:
        """The flex instances' KV cache (vLLM): use, prefix-cache hits, tier loads."""
        by, w = self.by_instance, self.window
        instances = ("cluster.flex_namespace", "metrics.instance_labels")
        rated = (*instances, "metrics.rate_window")
        from_tier = self.vllm("prompt_tokens_by_source_total", 'source="external_kv_transfer"')
        return [
            Query(
                KV_CACHE_USAGE,
                f"max by ({by}) ({self.vllm('kv_cache_usage_perc')})",
                "Share of KV-cache blocks in use on each flex vLLM instance.",
                "ratio",
                instances,
            ),
            Query(
                KV_CACHE_HIT_RATE,
                f"sum by ({by}) (rate({self.vllm('prefix_cache_hits_total')}[{w}]))"
                f" / (sum by ({by}) (rate({self.vllm('prefix_cache_queries_total')}[{w}]))"
                f" {self.min_queried_tokens()})",
                "Prefix-cache hits per queried token; absent where an instance queried fewer "
                "than alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s tokens per "
                "second (or none), so a nearly idle instance never fires.",
                "ratio",
                (*rated, "alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s"),
            ),
            Query(
                PROMPT_TOKENS_FROM_TIER,
                f"sum by ({by}) (rate({from_tier}[{w}]))"
                f" / (sum by ({by}) (rate({self.vllm('prompt_tokens_total')}[{w}])) > 0)",
                "Share of each instance's prefill tokens loaded through the KV offloading "
                "connector (its host-memory and snapshot-volume tiers) instead of computed or "
                "found in the GPU prefix cache; absent where it had no prompt tokens.",
                "ratio",
                rated,
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The KV-cache queries, each with the policy fields it reads."""
    return _KvCacheQueries(policy).queries()
