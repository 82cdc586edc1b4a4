"""GPUs (dcgm-exporter): utilization and framebuffer, shown on the dashboard."""

from __future__ import annotations

from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from runtime.metrics.catalogue.names import (
    CLUSTER_GPU_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    POOL_GPU_UTILIZATION,
)
from runtime.metrics.catalogue.promql import Selectors
from runtime.metrics.catalogue.query import Query


class _GpuQueries(Selectors):
    """The GPU queries and the joins only they read."""

    def gpu_util_by_pool(self, pools: list[NodePool]) -> str:
        """Per-GPU utilization (0-1) with a ``pool`` label, joined through the node's pool label."""
        gpu = (
            f'label_replace(DCGM_FI_DEV_GPU_UTIL, "node", "$1", "{self.m.gpu_node_label}", "(.*)")'
        )
        return f"(({gpu}) / 100 * on (node) group_left (pool) {self.node_pool(pools)})"

    def cluster_utilization(self) -> str:
        """Mean utilization (0-1) of every GPU dcgm-exporter reports."""
        return "(avg(DCGM_FI_DEV_GPU_UTIL) / 100)"

    def queries(self) -> list[Query]:
        """GPUs (dcgm-exporter): utilization and framebuffer, shown on the dashboard."""
        all_pools = self.gpu_util_by_pool(self.policy.node_pools)
        pooled = ("cluster.pool_label", "node_pools[].name", "metrics.gpu_node_label")
        return [
            Query(
                CLUSTER_GPU_UTILIZATION,
                self.cluster_utilization(),
                "Mean utilization of every GPU dcgm-exporter reports (flex included; shown, "
                "never decided on).",
                "ratio",
            ),
            Query(
                GPU_UTILIZATION,
                all_pools,
                "Utilization of each GPU, with its pool.",
                "ratio",
                pooled,
            ),
            Query(
                POOL_GPU_UTILIZATION,
                f"avg by (pool) ({all_pools})",
                "Mean GPU utilization of each node pool.",
                "ratio",
                pooled,
            ),
            Query(
                GPU_MEMORY_USED,
                "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
                "Framebuffer share in use on each GPU.",
                "ratio",
            ),
        ]


def queries(policy: PoolPolicy) -> list[Query]:
    """The GPU queries, each with the policy fields it reads."""
    return _GpuQueries(policy).queries()
