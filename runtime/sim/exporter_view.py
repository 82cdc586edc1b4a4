"""What dcgm-exporter and kube-state-metrics would report of the replayed cluster at an
evaluation, and the tallies the budget reads from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from runtime.sim.budget import (
    ExporterView,
    NodeState,
    PodState,
    of_deployment,
)
from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Phase
from runtime.sim.fleet_pools import pod_name


def pool_duty(cluster: Cluster, util: dict[str, float]) -> dict[str, float]:
    """Mean ``DCGM_FI_DEV_GPU_UTIL`` (0-1) of each pool's GPUs: running pods report their
    owner's duty cycle, starting and terminating ones 0 (loading or draining), unallocated
    GPUs 0."""
    out: dict[str, float] = {}
    for pool in cluster.nodes:
        _, running = cluster.pool_owners(pool)
        busy = sum(gpus * util[owner] for owner, gpus in running.items())
        size = cluster.pool_gpus(pool)
        out[pool] = busy / size if size else 0.0
    return out


def exporter_view(
    cluster: Cluster,
    now: float,
    util: dict[str, float],
    spec: dict[str, int],
    identity: dict[str, tuple[str, str]],
    seen: dict[int, tuple[tuple[object, ...], PodState]],
) -> ExporterView:
    """What kube-state-metrics and dcgm-exporter would report: nodes (a node still being
    provisioned is NotReady), every live pod with its node, phase and deletion mark, and
    the duty cycle of the GPUs bound pods hold (starting pods report 0). ``identity`` gives
    each owner's namespace and pod-name prefix; ``seen`` keeps each pod's last state,
    reused while nothing it reports has changed."""
    nodes = tuple(
        NodeState(node.name, pool, node.gpus, schedulable=node.ready_at <= now)
        for pool, members in cluster.nodes.items()
        for node in members
    )
    pct = percent(util)
    pods = []
    live: dict[int, tuple[tuple[object, ...], PodState]] = {}
    for pod in cluster.pods:
        if pod.phase is Phase.GONE:
            continue
        reported = (
            None if pod.node is None else pct[pod.owner] if pod.phase is Phase.RUNNING else 0.0
        )
        key = (pod.phase, pod.node, reported)
        known = seen.get(pod.uid)
        if known is None or known[0] != key:
            namespace, prefix = identity[pod.owner]
            state = PodState(
                namespace,
                pod_name(prefix, pod.uid),
                pod.gpus,
                "Pending" if pod.phase is Phase.PENDING else "Running",
                node=None if pod.node is None else pod.node.name,
                production=pod.production,
                terminating=pod.phase is Phase.TERMINATING,
                util_pct=reported,
            )
            known = (key, state)
        live[pod.uid] = known
        pods.append(known[1])
    seen.clear()
    seen.update(live)
    return ExporterView(nodes, tuple(pods), dict(spec))


def percent(util: Mapping[str, float]) -> dict[str, float]:
    """``DCGM_FI_DEV_GPU_UTIL`` (percent, as exported) of each owner's running pods."""
    return {owner: round(u * 100, 6) for owner, u in util.items()}


@dataclass(frozen=True)
class Tallies:
    """What ``exporter_view`` would report, summed from the cluster's counters instead of
    a state per pod: the same numbers (``Exports``; ``tests/sim/test_budget_promql.py``
    checks them against the view on every evaluation of a replay). The budget reads these
    when no observer or tuner needs the series themselves."""

    cluster: Cluster
    now: float
    util: Mapping[str, float]
    spec_replicas: Mapping[str, int]
    identity: Mapping[str, tuple[str, str]]

    def _ready(self, pools: set[str], unit: int) -> tuple[int, int] | None:
        """``Cluster.ready`` summed over ``pools``."""
        ready = [self.cluster.ready(p, self.now, unit) for p in self.cluster.nodes if p in pools]
        found = [r for r in ready if r is not None]
        if not found:
            return None
        return sum(gpus for gpus, _ in found), sum(units for _, units in found)

    def schedulable_gpus(self, pools: set[str]) -> int | None:
        ready = self._ready(pools, 1)
        return None if ready is None else ready[0]

    def free_gpus(self, pools: set[str], unit: int = 1) -> int:
        ready = self._ready(pools, unit)
        return 0 if ready is None else ready[1]

    def pending_gpus(self, *, production: bool | None, namespace: str | None) -> int:
        return sum(
            self.cluster.gpus(owner, Phase.PENDING)
            for owner, prod in self.cluster.owners().items()
            if (production is None or prod == production)
            and (namespace is None or self.identity[owner][0] == namespace)
        )

    def production_busy(self) -> float | None:
        """Exactly the view's ``fsum`` (correctly rounded): each running pod adds ``pct / 100 x
        GPUs``, summed here as rationals and rounded once; bound pods that are not running
        report 0, so production never holds GPUs without a series (never None)."""
        pct = percent(self.util)
        busy = Fraction(0)
        for owner, prod in self.cluster.owners().items():
            if prod:
                for gpus, pods in self.cluster.sizes(owner, Phase.RUNNING).items():
                    busy += Fraction(pct[owner] / 100 * gpus) * pods
        return float(busy)

    def held_gpus(self, namespace: str, deployment: str) -> int:
        return sum(
            self.cluster.gpus(owner, Phase.STARTING) + self.cluster.gpus(owner, Phase.RUNNING)
            for owner in self.cluster.owners()
            if self.identity[owner][0] == namespace
            and of_deployment(deployment, pod_name(self.identity[owner][1], 0))
        )
