"""The flex GPU budget, evaluated in Python with the catalogue's exact semantics.

``runtime.metrics.catalogue`` turns the policy into PromQL that Prometheus evaluates in the
cluster; the what-if engine needs the same number from simulated exporter values at every
evaluation. This module mirrors ``_Builder.headroom`` and ``_Builder.budget`` term by term
(same inputs, thresholds, floors and clamps, the same "no series" outcomes), and
``tests/sim/test_budget_promql.py`` proves the two equal by writing sampled simulated states
into a real Prometheus and evaluating the catalogue's query there. Change both together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from policy.nodepools import NodePool
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload


@dataclass(frozen=True)
class ExporterView:
    """What the budget query reads, as the exporters would report it at one instant.

    ``gpu_util_pct`` holds ``DCGM_FI_DEV_GPU_UTIL`` (percent) of every GPU on a node that
    carries the pool label, keyed by pool; ``unpooled_util_pct`` those of GPUs on nodes
    without it (they count in the cluster mean, not in any pool). ``spec_replicas`` is
    ``kube_deployment_spec_replicas`` of each flex Deployment (absent: no series).
    """

    gpu_util_pct: Mapping[str, NDArray[np.float64]]
    spec_replicas: Mapping[str, int]
    unpooled_util_pct: NDArray[np.float64] | None = None

    def cluster_utilization(self) -> float | None:
        """``avg(DCGM_FI_DEV_GPU_UTIL) / 100``; None when no GPU reports."""
        parts = [*self.gpu_util_pct.values()]
        if self.unpooled_util_pct is not None:
            parts.append(self.unpooled_util_pct)
        values = np.concatenate(parts) if parts else np.empty(0)
        if values.size == 0:
            return None
        return math.fsum(values.tolist()) / values.size / 100


def headroom(policy: PoolPolicy, pool: NodePool, view: ExporterView) -> float | None:
    """``_Builder.headroom``: idle GPUs of ``pool`` minus floor(GPUs x reserve), at least 0."""
    util = view.gpu_util_pct.get(pool.name)
    if util is None or util.size == 0:
        return None
    idle = float(np.count_nonzero(util / 100 < policy.elastic.idle_gpu_below))
    if pool.reserve_ratio > 0:
        idle -= math.floor(util.size * pool.reserve_ratio)
    return max(idle, 0.0)


def budget(policy: PoolPolicy, workload: FlexWorkload, view: ExporterView) -> float | None:
    """``_Builder.budget``: GPUs ``workload`` may occupy, or None where PromQL has no series.

    None (the HPA then holds) when the Deployment's replicas or every GPU series is missing.
    """
    replicas = view.spec_replicas.get(workload.name)
    cluster = view.cluster_utilization()
    if replicas is None or cluster is None:
        return None
    g = workload.gpus_per_replica
    elastic = policy.elastic
    sharing = sum(1 for w in policy.workloads if w.pool == workload.pool)
    room = headroom(policy, policy.pool_of(workload), view)
    step: float
    if room is not None and cluster < elastic.scale_up_below:
        step = math.floor(room / (sharing * g)) * g
    elif cluster > elastic.shed_above:
        step = -g
    else:
        step = 0.0
    return max(replicas * g + step, 0.0)
