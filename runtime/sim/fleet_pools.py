"""The flex fleets and production's pools of a replay: each fleet behind its endpoint picker,
the pickers' saturation, production lending its idle GPU time to its traffic classes, and
the totals at the end. Shared by the pooled loop and the fixed topology."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from policy.base import duration_seconds
from policy.pool import PoolPolicy
from runtime.sim.classes import (
    ClassPlan,
    ClassTotals,
    Member,
    close_totals,
    new_totals,
    pool_saturation,
)
from runtime.sim.production import ProductionGroup
from runtime.sim.replay_model import FleetTotals, FlexInput, Settings
from runtime.sim.request_stream import Admission
from runtime.sim.serving import Fleet


def preserves_kv(policy: PoolPolicy) -> bool:
    """Whether flex replicas keep their prefix cache across exits: only the filesystem tier
    (the snapshot volume) outlives the pod; host memory does not."""
    return policy.kv_cache.kv_preservation == "filesystem"


def build_fleet(policy: PoolPolicy, f: FlexInput, admission: Admission | None = None) -> Fleet:
    return Fleet.admit(
        f.requests,
        max_model_len=f.workload.max_model_len,
        latencies=f.latencies,
        kv_tokens=f.kv_tokens,
        max_num_seqs=f.workload.max_num_seqs,
        preservation=preserves_kv(policy),
        backlog_window=f.backlog_window,
        admission=admission,
    )


def admission_of(classes: ClassPlan | None, f: FlexInput) -> Admission | None:
    """The workload's fleet sits behind a picker when its demand has traffic classes."""
    if classes is None or f.workload.name not in classes.flex_pools:
        return None
    return classes.admission


def sheds(classes: ClassPlan | None, workload: str, saturation: Mapping[str, float]) -> bool:
    """Whether the workload's pool refuses sheddable requests this step."""
    if classes is None or workload not in classes.flex_pools:
        return False
    return saturation[classes.flex_pools[workload]] >= 1.0


def saturations(
    classes: ClassPlan | None,
    fleets: Mapping[str, Fleet],
    running: Mapping[str, int],
    pools: ProductionPools,
    lent: Mapping[str, tuple[float, float]],
) -> dict[str, float]:
    """Every pool's saturation at the step's start: the fleets' last metrics over the
    instances ready now (``runtime.sim.classes.pool_saturation``)."""
    if classes is None:
        return {}
    members = [
        Member(pool, running[name], fleets[name].waiting, fleets[name].kv_usage)
        for name, pool in classes.flex_pools.items()
    ]
    members += [
        Member(pool, lent[pool][0], fleet.waiting, fleet.kv_usage)
        for pool, fleet in pools.fleets.items()
    ]
    return pool_saturation(members, classes.detector)


class ProductionPools:
    """The production instances that serve traffic classes, per pool: which production
    groups are members (the trace's one-GPU pods serve every pool; a policy's workload the
    pools of its namespace), their fleets and totals."""

    def __init__(
        self, policy: PoolPolicy, classes: ClassPlan | None, groups: tuple[ProductionGroup, ...]
    ) -> None:
        self.plan = classes
        demands = () if classes is None else classes.production
        self.demand = {d.pool: d for d in demands}
        self.fleets = {
            d.pool: classes.fleet(d, preserves_kv(policy)) for d in demands if classes is not None
        }
        self.totals = {pool: FleetTotals() for pool in self.fleets}
        self.members = {
            d.pool: tuple(g for g in groups if g.scaling == "trace" or g.namespace == d.namespace)
            for d in demands
        }
        self.class_totals: dict[str, ClassTotals] = {} if classes is None else new_totals(classes)

    def lent(
        self, pool: str, running: Callable[[str], int], util: Mapping[str, float]
    ) -> tuple[float, float]:
        """(ready instances, idle GPUs) of the pool's production pods now (pooled replay)."""
        pods = 0.0
        idle = 0.0
        for g in self.members[pool]:
            n = running(g.owner)
            pods += n
            idle += n * g.gpus_per_replica * (1.0 - util[g.owner])
        return pods, idle

    def fixed(self, pool: str, prod_gpus: int, util: float) -> tuple[float, float]:
        """The same in the fixed topology: production holds ``prod_gpus`` at ``util``, split
        between its groups by their share of the load."""
        pods = 0.0
        idle = 0.0
        for g in self.members[pool]:
            gpus = prod_gpus * g.share
            pods += gpus / g.gpus_per_replica
            idle += gpus * (1.0 - util)
        return pods, idle

    def serve(
        self,
        now: float,
        dt: float,
        lent: Mapping[str, tuple[float, float]],
        saturation: Mapping[str, float],
    ) -> None:
        """Serve each pool's requests with the idle GPU time it was lent this step."""
        for pool, fleet in self.fleets.items():
            replicas = lent[pool][1] / self.demand[pool].replica_gpus
            result = fleet.serve(now, dt, replicas, saturated=saturation[pool] >= 1.0)
            self.totals[pool].add(result)

    def close(self, fleets: Mapping[str, Fleet], settings: Settings) -> dict[str, ClassTotals]:
        """Each class's totals over the flex and production fleets at the replay's end."""
        if self.plan is None:
            return {}
        close_fleets(dict(self.fleets), self.totals, settings)
        end = settings.steps * settings.step_s
        return close_totals(
            self.class_totals, [*fleets.values(), *self.fleets.values()], self.plan, end
        )


def close_fleets(
    fleets: dict[str, Fleet], totals: dict[str, FleetTotals], settings: Settings
) -> None:
    end = settings.steps * settings.step_s
    for name, fleet in fleets.items():
        totals[name].arrived = fleet.arrived(end)
        totals[name].dropped = fleet.rejected(end)
        totals[name].kv_tokens_lost = fleet.kv_tokens_lost
        if fleet.admission is not None:
            totals[name].shed = int(fleet.shed.sum())
            totals[name].lost = int(fleet.lost.sum())


def consolidate_after(policy: PoolPolicy) -> float:
    value = policy.flex_pools[0].karpenter.consolidate_after
    return math.inf if value == "Never" else float(duration_seconds(value))


def pod_name(prefix: str, uid: int) -> str:
    """``<deployment>-<pod-template-hash>-<suffix>``, as the ReplicaSet names pods."""
    return f"{prefix}-sim-{uid:05d}"


def evaluation_every(policy: PoolPolicy, settings: Settings) -> int:
    """Loop steps between two evaluations of the recording rules."""
    interval = duration_seconds(policy.metrics.evaluation_interval)
    return max(1, round(interval / settings.step_s))


def with_max_replicas(hpa: dict[str, object], max_replicas: int) -> dict[str, object]:
    """The rendered HPA with the layout's replica bound (the same as the policy's unless the
    replay's layout resizes the cluster)."""
    spec = dict(hpa["spec"])  # type: ignore[call-overload]
    spec["maxReplicas"] = max_replicas
    return {**hpa, "spec": spec}
