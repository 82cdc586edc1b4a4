"""The snapshot volumes (the GC sidecars; only with ``kv_cache.kv_preservation: filesystem``)."""

from __future__ import annotations

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import KV_TIER_DELETIONS, KV_TIER_FILL
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Query


class _SnapshotQueries(Selectors):
    """The snapshot-volume queries and the selectors only they read."""

    def kv_tier(self, name: str) -> str:
        """Selector of a snapshot GC sidecar metric (``gpupool_kv_tier_<name>``) of the flex
        pods; the sidecar runs only with ``kv_cache.kv_preservation: filesystem``."""
        return f'gpupool_kv_tier_{name}{{namespace="{self.flex_ns}"}}'

    def by_volume(self) -> str:
        """Labels of one snapshot volume: it belongs to a workload, every replica mounts it."""
        return f"namespace, {self.m.workload_label}"

    def queries(self) -> list[Query]:
        """The snapshot volumes (the GC sidecars; only with kv_preservation: filesystem)."""
        volume = ("cluster.flex_namespace", "metrics.workload_label")
        return [
            Query(
                KV_TIER_DELETIONS,
                f"sum by ({self.by_volume()}, reason) "
                f"(rate({self.kv_tier('deleted_files_total')}[{self.window}])) * 60",
                "Files the snapshot GCs deleted from each workload's volume per minute, by "
                "reason (abandoned_write, reclaimed, capacity); a file two GCs raced on counts "
                "in both. Only with kv_preservation: filesystem.",
                "per_minute",
                (*volume, "metrics.rate_window"),
            ),
            Query(
                KV_TIER_FILL,
                f"max by ({self.by_volume()}) ({self.kv_tier('used_bytes')}"
                f" / ({self.kv_tier('capacity_bytes')} > 0))",
                "Bytes on each workload's snapshot volume over the tier's capacity "
                "(snapshot_volume.tier_capacity), as its GCs last scanned it (the fullest "
                "view); capacity passes bring it back to 0.9. Only with kv_preservation: "
                "filesystem.",
                "ratio",
                volume,
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The snapshot-volume queries, each with the policy fields it reads."""
    return _SnapshotQueries(policy).queries()
