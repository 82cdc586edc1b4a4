"""The closed loop: production demand -> scheduler -> exporters -> budget -> HPA -> flex pods.

Every ``step_s`` (the HPA's default 15 s sync period) the replay

1. finishes pod start-ups and graceful terminations that are due, lets Karpenter act;
2. sets production's replicas (``runtime.sim.production``: the policy's production
   workloads and their HPAs, or a rule on the trace) and each flex Deployment's replicas
   from its HPA, creating and deleting pods the way the ReplicaSet controller does;
3. schedules pending pods (``runtime.sim.cluster``: priority order, preemption, grace);
4. serves production demand and each flex fleet's requests (``runtime.sim.serving``); with
   traffic classes (a policy with a ``serving`` section, ``runtime.sim.classes``) each pool's
   endpoint picker first refuses the step's sheddable arrivals while it is saturated, and
   production instances serve their classes' requests in the GPU time production leaves idle;
5. every ``metrics.evaluation_interval`` writes what dcgm-exporter and kube-state-metrics
   would report and evaluates the budget with the catalogue's semantics (``budget``);
6. runs each flex HPA (``runtime.sim.hpa``, the controller's own algorithm) on the latest
   recorded budget;
7. with a ``Tuning`` (``gpupool whatif --tuner``, ``runtime.sim.tuning``), hands it what the
   exporters and the cluster showed at each evaluation (``LoopState``) and adopts the policy
   it returns (a tuner proposal merged after review) from the next step on.

The fixed-topology baseline (``replay_fixed``) serves the same demand on the same hardware
with production keeping the most GPUs it ever holds in the trace and flex only on the rest.
Both are pure functions of their inputs: same inputs, same result.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from infra.builders.nodepools import Target
from infra.builders.workload import HpaTolerance, autoscaler
from policy.base import duration_seconds
from policy.pool import PoolPolicy
from policy.priorities import PriorityTier
from policy.workloads import FlexWorkload
from runtime.sim.budget import (
    ExporterView,
    Exports,
    NodeState,
    PodState,
    budget,
    held,
    of_deployment,
    production_utilization,
    spare,
)
from runtime.sim.classes import (
    ClassPlan,
    ClassTotals,
    Member,
    close_totals,
    new_totals,
    pool_saturation,
    record_shed,
)
from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Eviction, Node, Phase, Pod, Waiting
from runtime.sim.counts import TokenCounts
from runtime.sim.hpa import HpaState, PodSample, reconcile
from runtime.sim.hpa_spec import HpaSpec
from runtime.sim.production import ProductionGroup, ProductionRule, production_groups
from runtime.sim.serving import (
    Admission,
    Fleet,
    Requests,
    StepLatencies,
    StepResult,
)
from runtime.sim.traces import ProductionTrace


@dataclass(frozen=True)
class Settings:
    """Replay knobs that are not policy: time, start-up, provisioning."""

    hours: float
    step_s: float = 15.0
    flex_startup_s: float = 300.0
    """Image pull + model load of a flex vLLM replica (``--startup-s``)."""
    production: ProductionRule = field(default_factory=ProductionRule)
    target: Target = "labels"
    karpenter_delay_s: float = 180.0
    """Karpenter: from a pending pod to a ready GPU node."""
    hpa_tolerance: HpaTolerance = "cluster"
    """The stack option ``gpupool:hpaTolerance`` the flex HPAs are rendered with."""

    @property
    def steps(self) -> int:
        return round(self.hours * 3600 / self.step_s)


@dataclass(frozen=True)
class FlexInput:
    """One flex workload's demand and the numbers its vLLM plan and service model give."""

    workload: FlexWorkload
    requests: Requests
    kv_tokens: int
    latencies: StepLatencies
    backlog_window: int = 0


@dataclass(frozen=True)
class Layout:
    """Nodes per pool and each workload's replica bound, for one replay."""

    nodes: dict[str, int]
    gpus_per_node: dict[str, int]
    max_replicas: dict[str, int]

    @property
    def total_gpus(self) -> int:
        return sum(self.nodes[p] * self.gpus_per_node[p] for p in self.nodes)

    @classmethod
    def of_policy(cls, policy: PoolPolicy) -> Layout:
        return cls(
            {p.name: p.max_nodes for p in policy.node_pools},
            {p.name: p.gpus_per_node for p in policy.node_pools},
            {w.name: policy.replica_bound(w) for w in policy.workloads},
        )


@dataclass
class Series:
    """Per-step time series of one replay (GPU counts, pods, tokens)."""

    t: list[float] = field(default_factory=list)
    prod_need: list[int] = field(default_factory=list)
    prod_gpus: list[int] = field(default_factory=list)
    prod_pending: list[int] = field(default_factory=list)
    prod_pending_by_cause: dict[Waiting, list[int]] = field(
        default_factory=lambda: {cause: [] for cause in Waiting}
    )
    """Pending production pods per step by why they wait (``cluster.Waiting``)."""
    prod_busy_served: list[float] = field(default_factory=list)
    prod_busy: list[float] = field(default_factory=list)
    """Production's busy GPU-equivalents in the trace (what it wanted to serve)."""
    flex_gpus: list[int] = field(default_factory=list)
    flex_running_gpus: list[int] = field(default_factory=list)
    flex_pending: list[int] = field(default_factory=list)
    flex_duty: list[float] = field(default_factory=list)
    free_gpus: list[int] = field(default_factory=list)
    total_gpus: list[int] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)
    flex_tokens: list[int] = field(default_factory=list)
    self_shed: list[int] = field(default_factory=list)
    """Workloads whose budget was below the GPUs they held while production needed nothing
    (its share under the shed threshold and the unallocated GPUs above every reserve)."""
    prod_wait_max_s: list[float] = field(default_factory=list)
    """Longest a pending production pod had waited, at each step."""
    budget_over_free: list[int] = field(default_factory=list)
    """GPUs of budget beyond what the flex pool could place (held + unallocated), at the
    steps the budget was evaluated (in between it is as stale as the recording rule)."""
    util_by_pool: dict[str, list[float]] = field(default_factory=dict)
    """Mean GPU duty cycle of each pool (what dcgm-exporter reports, averaged)."""
    alloc_by_pool: dict[str, list[float]] = field(default_factory=dict)
    """Share of each pool's GPUs requested by bound pods."""
    flex_by_pool: dict[str, list[int]] = field(default_factory=dict)
    """GPUs held by running flex replicas in each pool."""
    capped: dict[str, list[bool]] = field(default_factory=dict)
    """Per workload: whether its budget asked for more replicas than its HPA's bound."""

    def append(self, **values: float) -> None:
        for name, value in values.items():
            getattr(self, name).append(value)

    def array(self, name: str) -> NDArray[np.float64]:
        return np.asarray(getattr(self, name), dtype=np.float64)


@dataclass(frozen=True)
class StepRecord:
    """What one pooled step hands its recording phase besides the cluster's state."""

    now: float
    prod_need: int
    """GPUs production's replicas asked for (phase 2)."""
    prod_busy: float
    """Production's busy GPU-equivalents in the trace (what it wanted to serve)."""
    prod_busy_served: float
    """The part of it production's running pods served (phase 4)."""
    flex_tokens: int
    evictions: list[Eviction]
    """The step's preemptions (phase 3)."""
    evaluated: bool
    """Whether the budget was evaluated this step (phase 5)."""


FIRST_MINUTE_S = 60.0
"""How long after an eviction the requests served count towards ``AfterEvictions``."""


@dataclass
class AfterEvictions:
    """Prefix tokens of the requests served in the steps that start within
    ``FIRST_MINUTE_S`` of an eviction, summed over the evicted replicas: a step after two
    evictions counts twice, so each eviction weighs by the tokens its own minute queried."""

    evicted_replicas: int = 0
    """Running replicas preempted (a pod preempted while starting held no cache)."""
    query_tokens: int = 0
    hit_tokens_with_tier: float = 0.0
    hit_tokens_without_tier: float = 0.0


@dataclass
class FleetTotals(TokenCounts):
    """One fleet's counts over a replay (each step's ``StepResult`` added) and its requests'
    fate at the end."""

    arrived: int = 0
    dropped: int = 0
    kv_tokens_lost: float = 0.0
    after_evictions: AfterEvictions = field(default_factory=AfterEvictions)
    shed: int = 0
    """Refused by the endpoint picker (traffic classes only)."""
    lost: int = 0
    """Aborted in flight on a pod that exited (traffic classes only)."""

    @property
    def outstanding(self) -> int:
        return self.arrived - self.completed - self.shed - self.lost


@dataclass
class Replay:
    """What one replay produced: the series and per-workload request accounting."""

    name: str
    step_s: float
    series: Series
    fleets: dict[str, FleetTotals]
    classes: dict[str, ClassTotals] = field(default_factory=dict)
    """Per traffic class (a policy with a ``serving`` section; empty without one)."""
    production_fleets: dict[str, FleetTotals] = field(default_factory=dict)
    """Requests of production-served classes, per production pool."""


Progress = Callable[[int, int], None]
Observer = Callable[[float, ExporterView], None]
"""Sees every exporter state the budget is evaluated on (tests compare it with PromQL)."""


@dataclass(frozen=True)
class FleetState:
    """What one flex workload's vLLM instances and HPA showed at an evaluation."""

    instances: tuple[str, ...]
    """Pod names (as in the exporter view) of the running replicas: the vLLM targets."""
    waiting: float
    """Requests queued beyond the running batch, over the whole fleet."""
    kv_usage: float
    """KV-cache share each running replica uses (the fluid model keeps them equal)."""
    hit_tokens: float
    """Prefix-cache hit tokens served so far (requests with block hashes), cumulative."""
    query_tokens: int
    """Prompt tokens of requests with block hashes served so far, cumulative."""
    hpa: str
    """Name of the workload's HPA (the rendered manifest's)."""
    current_replicas: int
    """The Deployment's live pods (the HPA's ``status.currentReplicas``)."""
    max_replicas: int
    """The HPA's ``maxReplicas`` in this replay."""


@dataclass(frozen=True)
class LoopState:
    """The replay at one budget evaluation, as the tuner's sources would show it."""

    at: float
    policy: PoolPolicy
    """The policy in force (its recording rules and HPAs are the cluster's)."""
    view: ExporterView
    evictions: tuple[tuple[float, str], ...]
    """(time, raw reason) of every flex pod disrupted within ``metrics.rate_window``."""
    fleets: Mapping[str, FleetState]


@dataclass(frozen=True)
class Retune:
    """A policy to run from the next step on, and each workload's vLLM KV tokens under it."""

    policy: PoolPolicy
    kv_tokens: Mapping[str, int]


class Tuning(Protocol):
    """Sees the loop at every budget evaluation; may hand back a policy to adopt."""

    def observe(self, state: LoopState) -> Retune | None: ...


def replay_pooled(
    policy: PoolPolicy,
    layout: Layout,
    trace: ProductionTrace,
    flex: list[FlexInput],
    settings: Settings,
    *,
    progress: Progress | None = None,
    observe: Observer | None = None,
    tuning: Tuning | None = None,
    classes: ClassPlan | None = None,
) -> Replay:
    """The policy's closed loop on ``layout`` (see the module docstring); ``tuning`` may
    change the policy during the replay (phase 7); ``classes``: traffic classes behind the
    endpoint pickers (None: no serving layer, as without a ``serving`` section)."""
    loop = _PooledLoop(policy, layout, trace, flex, settings, observe, tuning, classes)
    steps = settings.steps
    for step in range(steps):
        loop.step(step)
        if progress is not None:
            progress(step + 1, steps)
    totals = loop.close()
    return Replay(
        "pooled",
        settings.step_s,
        loop.series,
        totals,
        loop.class_totals,
        loop.prod_totals,
    )


def replay_fixed(
    policy: PoolPolicy,
    layout: Layout,
    trace: ProductionTrace,
    flex: list[FlexInput],
    settings: Settings,
    *,
    classes: ClassPlan | None = None,
) -> Replay:
    """The fixed topology on the same hardware and demand (the baseline of every claim).

    Production keeps the most GPUs its instances hold at any time of the trace; flex runs on
    every GPU no production instance ever holds (each workload's bound raised to that; the
    GPUs split evenly between the workloads, in whole replicas). Nothing is evicted and
    nothing waits.
    With ``classes`` the same endpoint pickers admit the same requests; production's
    instances lend the GPU time its held GPUs leave idle, split between its groups as in
    the pooled replay.
    """
    total = layout.total_gpus
    prod_gpus = int(trace.held.max())
    spare = max(0, total - prod_gpus)
    replicas: dict[str, int] = {}
    for left, f in zip(range(len(flex), 0, -1), flex, strict=True):
        n = spare // left // f.workload.gpus_per_replica
        replicas[f.workload.name] = n
        spare -= n * f.workload.gpus_per_replica
    fleets = {f.workload.name: _fleet(policy, f, _admission(classes, f)) for f in flex}
    totals = {name: FleetTotals() for name in fleets}
    pools = _ProductionPools(policy, classes, production_groups(policy, settings.production))
    series = Series(
        util_by_pool={"production": [], "flex": []}, alloc_by_pool={"production": [], "flex": []}
    )
    flex_gpus = sum(replicas[f.workload.name] * f.workload.gpus_per_replica for f in flex)
    for step in range(settings.steps):
        now = step * settings.step_s
        _held, busy = trace.at(now)
        tokens = 0
        duty = 0.0
        util = float(busy) / prod_gpus if prod_gpus else 0.0
        lent = {
            pool: pools.fixed(pool, prod_gpus, util) for pool in pools.fleets
        }  # (instances, idle GPUs) of each production pool
        saturation = _saturation(classes, fleets, replicas, pools, lent)
        for f in flex:
            name = f.workload.name
            result = fleets[name].serve(
                now, settings.step_s, replicas[name], saturated=_shed(classes, name, saturation)
            )
            totals[name].add(result)
            tokens += result.output_tokens
            duty += result.busy * replicas[name] * f.workload.gpus_per_replica
        pools.serve(now, settings.step_s, lent, saturation)
        if classes is not None:
            record_shed(pools.class_totals, [*fleets.values(), *pools.fleets.values()], classes)
        series.append(
            t=now,
            prod_need=prod_gpus,
            prod_gpus=prod_gpus,
            prod_pending=0,
            prod_wait_max_s=0.0,
            prod_busy_served=float(busy),
            prod_busy=float(busy),
            flex_gpus=flex_gpus,
            flex_running_gpus=flex_gpus,
            flex_pending=0,
            flex_duty=duty / flex_gpus if flex_gpus else 0.0,
            free_gpus=total - prod_gpus - flex_gpus,
            total_gpus=total,
            evictions=0,
            flex_tokens=tokens,
            self_shed=0,
            budget_over_free=0,
        )
        series.util_by_pool["production"].append(float(busy) / prod_gpus if prod_gpus else 0.0)
        series.util_by_pool["flex"].append(duty / flex_gpus if flex_gpus else 0.0)
        series.alloc_by_pool["production"].append(prod_gpus / total if total else 0.0)
        series.alloc_by_pool["flex"].append(flex_gpus / total if total else 0.0)
        for cause in Waiting:
            series.prod_pending_by_cause[cause].append(0)
    _close(fleets, totals, settings)
    return Replay(
        "fixed",
        settings.step_s,
        series,
        totals,
        pools.close(fleets, settings),
        pools.totals,
    )


def preserves_kv(policy: PoolPolicy) -> bool:
    """Whether flex replicas keep their prefix cache across exits: only the filesystem tier
    (the snapshot volume) outlives the pod; host memory does not."""
    return policy.kv_cache.kv_preservation == "filesystem"


def _fleet(policy: PoolPolicy, f: FlexInput, admission: Admission | None = None) -> Fleet:
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


def _admission(classes: ClassPlan | None, f: FlexInput) -> Admission | None:
    """The workload's fleet sits behind a picker when its demand has traffic classes."""
    if classes is None or f.workload.name not in classes.flex_pools:
        return None
    return classes.admission


def _shed(classes: ClassPlan | None, workload: str, saturation: Mapping[str, float]) -> bool:
    """Whether the workload's pool refuses sheddable requests this step."""
    if classes is None or workload not in classes.flex_pools:
        return False
    return saturation[classes.flex_pools[workload]] >= 1.0


def _saturation(
    classes: ClassPlan | None,
    fleets: Mapping[str, Fleet],
    running: Mapping[str, int],
    pools: _ProductionPools,
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


class _ProductionPools:
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
        _close(dict(self.fleets), self.totals, settings)
        end = settings.steps * settings.step_s
        return close_totals(
            self.class_totals, [*fleets.values(), *self.fleets.values()], self.plan, end
        )


def _close(fleets: dict[str, Fleet], totals: dict[str, FleetTotals], settings: Settings) -> None:
    end = settings.steps * settings.step_s
    for name, fleet in fleets.items():
        totals[name].arrived = fleet.arrived(end)
        totals[name].dropped = fleet.rejected(end)
        totals[name].kv_tokens_lost = fleet.kv_tokens_lost
        if fleet.admission is not None:
            totals[name].shed = int(fleet.shed.sum())
            totals[name].lost = int(fleet.lost.sum())


def _consolidate_after(policy: PoolPolicy) -> float:
    value = policy.flex_pools[0].karpenter.consolidate_after
    return math.inf if value == "Never" else float(duration_seconds(value))


class _PooledLoop:
    """State of one pooled replay; ``step`` runs the seven phases of the module docstring."""

    def __init__(
        self,
        policy: PoolPolicy,
        layout: Layout,
        trace: ProductionTrace,
        flex: list[FlexInput],
        settings: Settings,
        observe: Observer | None = None,
        tuning: Tuning | None = None,
        classes: ClassPlan | None = None,
    ) -> None:
        self.policy, self.layout, self.trace, self.settings = policy, layout, trace, settings
        self.plan = classes
        self.observe = observe
        self.tuning = tuning
        # (time, raw reason) of flex disruptions, kept for the tuner's eviction series.
        self.flex_evictions: deque[tuple[float, str]] = deque()
        karpenter = settings.target == "karpenter"
        self.cluster = Cluster(
            nodes={
                pool: [
                    Node(
                        f"{pool}-{i}", pool, layout.gpus_per_node[pool], layout.gpus_per_node[pool]
                    )
                    for i in range(0 if karpenter else count)
                ]
                for pool, count in layout.nodes.items()
            },
            shutdown_s=policy.disruption.shutdown_budget_s,
            pdb_min_available=policy.disruption.pdb_min_available,
            karpenter_delay_s=settings.karpenter_delay_s if karpenter else None,
            max_nodes=dict(layout.nodes),
            gpus_per_node=dict(layout.gpus_per_node),
            consolidate_after_s=_consolidate_after(policy),
        )
        self.workloads = {f.workload.name: f.workload for f in flex}
        self.fleets = {f.workload.name: _fleet(policy, f, _admission(classes, f)) for f in flex}
        self.totals = {name: FleetTotals() for name in self.fleets}
        # Per workload: (end of its first minute, replicas) of each recent eviction.
        self.evicted: dict[str, list[tuple[float, int]]] = {name: [] for name in self.fleets}
        self.hpa_names: dict[str, str] = {}
        self.hpas: dict[str, HpaSpec] = {}
        self._autoscalers()
        self.hpa_state = {name: HpaState() for name in self.workloads}
        self.spec = {name: w.min_replicas for name, w in self.workloads.items()}
        self.budget: dict[str, float | None] = dict.fromkeys(self.workloads)
        self.held = dict.fromkeys(self.workloads, 0)
        self.pod_states: dict[int, tuple[tuple[object, ...], PodState]] = {}
        self.production_needs = False
        self.flex_util = dict.fromkeys(self.workloads, 0.0)
        self.groups = production_groups(policy, settings.production)
        self.pools = _ProductionPools(policy, classes, self.groups)
        # Settled replicas per trace step: the trace rule's answer, and every group's start.
        self.settled = {g.owner: g.estimate(trace, settings.production) for g in self.groups}
        self.prod_spec = {owner: int(need[0]) for owner, need in self.settled.items()}
        self.prod_hpa_state = {g.owner: HpaState() for g in self.groups}
        self.prod_util = {g.owner: 0.0 for g in self.groups}
        self.identity = {g.owner: (g.namespace, g.pod_prefix) for g in self.groups} | {
            name: (policy.cluster.flex_namespace, name) for name in self.workloads
        }
        self.eval_every = _every(policy, settings)
        self.prod_pools = (policy.prod_pool.name, *(p.name for p in policy.flex_pools))
        self.series = Series()
        for pool in layout.nodes:
            self.series.util_by_pool[pool] = []
            self.series.alloc_by_pool[pool] = []
            self.series.flex_by_pool[pool] = []
        for name in self.workloads:
            self.series.capped[name] = []

    def step(self, step: int) -> None:
        """One step: the seven phases of the module docstring, in that order
        (docs/design/replay-loop.md says why)."""
        now = step * self.settings.step_s
        evaluates = step % self.eval_every == 0
        self.cluster.advance(now)
        prod_need = self._scale(step, now)
        evictions = self._schedule(step, now)
        _held, busy = self.trace.at(now)
        served = self._production_duty(float(busy))
        tokens = self._serve(now)
        view = self._evaluate(now) if evaluates else None
        self._autoscale(now)
        self._record(StepRecord(now, prod_need, float(busy), served, tokens, evictions, evaluates))
        if self.tuning is not None:
            self._tune(now, evictions, view)

    def _scale(self, step: int, now: float) -> int:
        """Phase 2: every owner's ``spec.replicas`` and the pods the ReplicaSet controller
        creates or deletes for it; returns the GPUs production's replicas ask for."""
        index = min(int(now // self.trace.step_s), self.trace.held.size - 1)
        # The first step is the cluster as the trace finds it: production already running.
        startup = 0.0 if step == 0 else self.settings.production.startup_s
        want = 0
        for g in self.groups:
            replicas = self._production_replicas(g, step, now, index)
            want += replicas * g.gpus_per_replica
            self._replicas(g.owner, replicas, now, self._production_pod(g, now, startup))
        for name, w in self.workloads.items():
            self._replicas(name, self.spec[name], now, self._flex_pod(w, now))
        return want

    def _schedule(self, step: int, now: float) -> list[Eviction]:
        """Phase 3: bind pending pods; the flex replicas preempted drop their share of the
        fleet's prefix cache and open an after-eviction minute."""
        # After the scale-downs (``_replicas`` accounts for those): only preemption is left.
        running = {name: self._running(name) for name in self.workloads}
        evictions = self.cluster.schedule(now)
        if step == 0:  # production found running serves from the first step
            self.cluster.finish_startups(now)
        for name in self.workloads:
            lost = running[name] - self._running(name)
            if lost > 0:
                self.fleets[name].lose_replicas(lost, running[name], now)
                self.totals[name].after_evictions.evicted_replicas += lost
                self.evicted[name].append((now + FIRST_MINUTE_S, lost))
        return evictions

    def _production_duty(self, busy: float) -> float:
        """Phase 4, production: each group's running pods take its share of the trace's busy
        GPU-equivalents (no more than they hold); returns what they served in all."""
        served = 0.0
        for g in self.groups:
            gpus = self._running(g.owner) * g.gpus_per_replica
            share = min(busy * g.share, float(gpus))
            self.prod_util[g.owner] = share / gpus if gpus else 0.0
            served += share
        return served

    def _serve(self, now: float) -> int:
        """Phase 4, requests: every flex fleet on its running replicas, then the production
        pools' classes on the GPU time production leaves idle, each pool's picker shedding
        while it is saturated; returns the flex output tokens of the step."""
        lent = {
            pool: self.pools.lent(pool, self._running, self.prod_util) for pool in self.pools.fleets
        }
        running = {name: self._running(name) for name in self.fleets}
        saturation = _saturation(self.plan, self.fleets, running, self.pools, lent)
        tokens = 0
        for name, fleet in self.fleets.items():
            result = fleet.serve(
                now,
                self.settings.step_s,
                running[name],
                saturated=_shed(self.plan, name, saturation),
            )
            self.flex_util[name] = result.busy
            self.totals[name].add(result)
            self._after_evictions(name, now, result)
            tokens += result.output_tokens
        self.pools.serve(now, self.settings.step_s, lent, saturation)
        if self.plan is not None:
            fleets = [*self.fleets.values(), *self.pools.fleets.values()]
            record_shed(self.pools.class_totals, fleets, self.plan)
        return tokens

    def _evaluate(self, now: float) -> ExporterView | None:
        """Phase 5: what the exporters report now, and the recording rules on it (each
        workload's budget and held GPUs, whether production needs GPUs back). Returns the
        per-pod view when an observer or the tuner needs it (else the tallies serve)."""
        c, util = self.cluster, self.prod_util | self.flex_util
        exports: Exports
        view: ExporterView | None = None
        if self.observe is None and self.tuning is None:
            exports = Tallies(c, now, util, dict(self.spec), self.identity)
        else:
            view = _exporter_view(c, now, util, self.spec, self.identity, self.pod_states)
            if self.observe is not None:
                self.observe(now, view)
            exports = view
        room = spare(self.policy, exports)
        load = production_utilization(self.policy, exports)
        self.production_needs = (room is not None and room < 0) or (
            load is not None and load > self.policy.elastic.shed_while_production_above
        )
        for name, w in self.workloads.items():
            self.budget[name] = budget(self.policy, w, exports)
            self.held[name] = held(self.policy, w, exports)
        return view

    def _autoscale(self, now: float) -> None:
        """Phase 6: each flex HPA on the latest recorded budget (None: no metric yet)."""
        for name in self.workloads:
            self.spec[name] = reconcile(
                self.hpas[name],
                self.hpa_state[name],
                now_s=now,
                current_replicas=self.spec[name],
                metric=self.budget[name],
            )

    def _tune(self, now: float, evictions: list[Eviction], view: ExporterView | None) -> None:
        """Phase 7: keep the flex disruptions for the tuner's eviction series; at an
        evaluation, hand it the loop's state and adopt the policy it returns."""
        assert self.tuning is not None
        self.flex_evictions.extend((now, e.reason) for e in evictions if not e.pod.production)
        if view is not None:
            retune = self.tuning.observe(self._state(now, view))
            if retune is not None:
                self.adopt(retune)

    def _state(self, now: float, view: ExporterView) -> LoopState:
        """What the tuner's sources show now: the exporter view, the flex disruptions of the
        rate window, and each fleet's vLLM and HPA figures."""
        window = duration_seconds(self.policy.metrics.rate_window)
        while self.flex_evictions and self.flex_evictions[0][0] <= now - window:
            self.flex_evictions.popleft()
        fleets = {}
        for name, fleet in self.fleets.items():
            running = sorted(p.uid for p in self.cluster.owned(name) if p.phase is Phase.RUNNING)
            totals = self.totals[name]
            fleets[name] = FleetState(
                instances=tuple(_pod_name(self.identity[name][1], uid) for uid in running),
                waiting=fleet.waiting if running else 0.0,
                kv_usage=fleet.kv_usage if running else 0.0,
                hit_tokens=totals.hit_tokens,
                query_tokens=totals.query_tokens,
                hpa=self.hpa_names[name],
                current_replicas=len(self.cluster.owned(name)),
                max_replicas=self.hpas[name].max_replicas,
            )
        return LoopState(now, self.policy, view, tuple(self.flex_evictions), fleets)

    def adopt(self, retune: Retune) -> None:
        """Run ``retune.policy`` from the next step, as after ``pulumi up`` of a merged
        change: the budget's thresholds and reserves (read from ``self.policy`` at every
        evaluation), the flex HPAs' specs (their stabilization history kept, as the
        controller keeps it across an update), the fleets' KV tokens, the evaluation
        interval and graceful shutdown. A Deployment rollout is not modelled: new
        ``--kv-cache-memory-bytes`` apply to the running fleet at once. Production's own
        workloads are no tuner lever and stay as the replay started."""
        policy = retune.policy
        if policy.production != self.policy.production:
            raise ValueError("a retuned policy must keep the production workloads")
        self.policy = policy
        self.workloads = {w.name: w for w in policy.workloads if w.name in self.workloads}
        self._autoscalers()
        for name, fleet in self.fleets.items():
            fleet.kv_tokens = retune.kv_tokens.get(name, fleet.kv_tokens)
        self.eval_every = _every(policy, self.settings)
        self.cluster.shutdown_s = policy.disruption.shutdown_budget_s
        self.cluster.pdb_min_available = policy.disruption.pdb_min_available

    def _autoscalers(self) -> None:
        """Each flex workload's HPA as rendered from ``self.policy``, bounded by the layout
        (which may raise a bound, never lower the policy's)."""
        for name, w in self.workloads.items():
            manifest = autoscaler(self.policy, w, self.settings.hpa_tolerance)
            bound = max(self.layout.max_replicas[name], self.policy.replica_bound(w))
            self.hpas[name] = HpaSpec.from_manifest(_with_max(manifest, bound))
            self.hpa_names[name] = str(manifest["metadata"]["name"])

    def _after_evictions(self, name: str, now: float, result: StepResult) -> None:
        """Count the step's prefix tokens once for every replica evicted in the last minute."""
        recent = [(end, n) for end, n in self.evicted[name] if end > now]
        self.evicted[name] = recent
        weight = sum(n for _, n in recent)
        if weight:
            after = self.totals[name].after_evictions
            after.query_tokens += weight * result.query_tokens
            after.hit_tokens_with_tier += weight * result.hit_tokens_with_tier
            after.hit_tokens_without_tier += weight * result.hit_tokens_without_tier

    def _production_replicas(self, g: ProductionGroup, step: int, now: float, index: int) -> int:
        """The group's ``spec.replicas`` this step: the rule's, the fixed count, or its HPA's
        answer on the duty its pods reported last step."""
        if g.scaling == "trace":
            return int(self.settled[g.owner][index])
        if g.hpa is not None and step > 0:
            self.prod_spec[g.owner] = reconcile(
                g.hpa,
                self.prod_hpa_state[g.owner],
                now_s=now,
                current_replicas=self.prod_spec[g.owner],
                metric=None,
                pods=self._pod_samples(g.owner),
            )
        return self.prod_spec[g.owner]

    def _pod_samples(self, owner: str) -> list[PodSample]:
        """What the Pods metric reports per pod: running pods their duty, bound ones that
        still load 0, Pending ones nothing (terminating pods are not counted)."""
        samples: list[PodSample] = []
        for pod in self.cluster.owned(owner):
            if pod.phase is Phase.PENDING:
                samples.append(None)
            else:
                samples.append(self.prod_util[owner] if pod.phase is Phase.RUNNING else 0.0)
        return samples

    def _production_pod(self, g: ProductionGroup, now: float, startup: float) -> Callable[[], Pod]:
        prio = self.policy.priorities.production
        return self._pod(g.owner, True, g.gpus_per_replica, prio, self.prod_pools, now, startup)

    def _flex_pod(self, w: FlexWorkload, now: float) -> Callable[[], Pod]:
        prio = self.policy.priorities.idle_inference
        startup = self.settings.flex_startup_s
        pools = tuple(p.name for p in self.policy.pools_for(w))
        return self._pod(w.name, False, w.gpus_per_replica, prio, pools, now, startup)

    def _pod(
        self,
        owner: str,
        production: bool,
        gpus: int,
        prio: PriorityTier,
        pools: tuple[str, ...],
        now: float,
        startup: float,
    ) -> Callable[[], Pod]:
        """What the ReplicaSet controller creates for ``owner``: one pending pod."""
        return lambda: self.cluster.create(
            owner=owner,
            production=production,
            gpus=gpus,
            priority=prio.value,
            may_preempt=prio.preemption_policy == "PreemptLowerPriority",
            pools=pools,
            now=now,
            startup_s=startup,
            packs=not production,
        )

    def _replicas(self, owner: str, want: int, now: float, make: Callable[[], Pod]) -> None:
        """The ReplicaSet controller: create or delete pods until ``want`` are live."""
        live = self.cluster.live(owner)
        for _ in range(want - live):
            make()
        if live <= want:
            return
        for pod in self.cluster.surplus(owner, live - want):
            before = self._running(owner)
            self.cluster.terminate(pod, now)
            if owner in self.fleets and pod.phase is Phase.TERMINATING:
                self.fleets[owner].lose_replicas(before - self._running(owner), before, now)

    def _running(self, owner: str) -> int:
        return self.cluster.count(owner, Phase.RUNNING)

    def _placeable(self, name: str, w: FlexWorkload) -> int:
        """GPUs of the workload's pools that its pods hold or could be given."""
        placeable = 0
        for pool in self.policy.pools_for(w):
            bound, _ = self.cluster.pool_owners(pool.name)
            other = sum(bound.values()) - bound.get(name, 0)
            placeable += self.cluster.pool_gpus(pool.name) - other
        return placeable

    def _record(self, rec: StepRecord) -> None:
        """The step's ``Series`` values, read from the cluster and the loop as the step left
        them (the HPAs changed replica counts only, no pod)."""
        c = self.cluster
        production = c.owners()
        prod = flex = flex_running = 0
        flex_busy = 0.0
        for pool in c.nodes:
            bound, running = c.pool_owners(pool)
            for owner, gpus in bound.items():
                if production[owner]:
                    prod += gpus
                else:
                    flex += gpus
            for owner, gpus in running.items():
                if not production[owner]:
                    flex_running += gpus
                    flex_busy += gpus * self.flex_util[owner]
        total = sum(c.pool_gpus(p) for p in c.nodes)
        pending = [p for p in c.by_phase[Phase.PENDING] if p.production]
        self_shed, over = self._budget_checks(rec.evaluated)
        self.series.append(
            t=rec.now,
            prod_need=rec.prod_need,
            prod_gpus=prod,
            prod_pending=len(pending),
            prod_wait_max_s=max((rec.now - p.pending_since for p in pending), default=0.0),
            prod_busy_served=rec.prod_busy_served,
            prod_busy=rec.prod_busy,
            flex_gpus=flex,
            flex_running_gpus=flex_running,
            flex_pending=sum(
                c.count(owner, Phase.PENDING) for owner, prod in production.items() if not prod
            ),
            flex_duty=flex_busy / flex_running if flex_running else 0.0,
            free_gpus=total - prod - flex,
            total_gpus=total,
            evictions=sum(1 for e in rec.evictions if not e.pod.production),
            flex_tokens=rec.flex_tokens,
            self_shed=self_shed,
            budget_over_free=max(over, 0),
        )
        for name, w in self.workloads.items():
            b, top = self.budget[name], self.hpas[name].max_replicas
            self.series.capped[name].append(b is not None and b > top * w.gpus_per_replica)
        for pool, mean in _pool_duty(c, self.prod_util | self.flex_util).items():
            self.series.util_by_pool[pool].append(mean)
            size = c.pool_gpus(pool)
            self.series.alloc_by_pool[pool].append(
                (size - c.pool_free(pool)) / size if size else 0.0
            )
            _, running = c.pool_owners(pool)
            self.series.flex_by_pool[pool].append(
                sum(gpus for owner, gpus in running.items() if not production[owner])
            )
        causes = [c.waiting(p, rec.now) for p in pending]
        for cause in Waiting:
            self.series.prod_pending_by_cause[cause].append(causes.count(cause))

    def _budget_checks(self, evaluated: bool) -> tuple[int, int]:
        """(workloads shedding on their own, GPUs of budget beyond what their pools could
        place): the first whenever a budget is known, the second only at an evaluation
        (against the cluster it was computed from)."""
        self_shed = over = 0
        for name, w in self.workloads.items():
            b = self.budget[name]
            if b is None:
                continue
            if b < self.held[name] and not self.production_needs:
                self_shed += 1
            if evaluated:
                over = max(over, int(b - self._placeable(name, w)))
        return self_shed, over

    def close(self) -> dict[str, FleetTotals]:
        _close(self.fleets, self.totals, self.settings)
        self.class_totals = self.pools.close(self.fleets, self.settings)
        self.prod_totals = self.pools.totals
        return self.totals


def _pool_duty(cluster: Cluster, util: dict[str, float]) -> dict[str, float]:
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


def _exporter_view(
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
    pct = _percent(util)
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
                _pod_name(prefix, pod.uid),
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


def _percent(util: Mapping[str, float]) -> dict[str, float]:
    """``DCGM_FI_DEV_GPU_UTIL`` (percent, as exported) of each owner's running pods."""
    return {owner: round(u * 100, 6) for owner, u in util.items()}


@dataclass(frozen=True)
class Tallies:
    """What ``_exporter_view`` would report, summed from the cluster's counters instead of
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
        pct = _percent(self.util)
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
            and of_deployment(deployment, _pod_name(self.identity[owner][1], 0))
        )


def _pod_name(prefix: str, uid: int) -> str:
    """``<deployment>-<pod-template-hash>-<suffix>``, as the ReplicaSet names pods."""
    return f"{prefix}-sim-{uid:05d}"


def _every(policy: PoolPolicy, settings: Settings) -> int:
    """Loop steps between two evaluations of the recording rules."""
    interval = duration_seconds(policy.metrics.evaluation_interval)
    return max(1, round(interval / settings.step_s))


def _with_max(hpa: dict[str, object], max_replicas: int) -> dict[str, object]:
    """The rendered HPA with the layout's replica bound (the same as the policy's unless the
    replay's layout resizes the cluster)."""
    spec = dict(hpa["spec"])  # type: ignore[call-overload]
    spec["maxReplicas"] = max_replicas
    return {**hpa, "spec": spec}
