"""What a replay takes and gives: its settings, hardware and flex inputs, the series it records
step by step, and the state a tuner observes (``runtime.sim.engine`` runs it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from infra.builders.stack_options import DEFAULT_STACK, StackOptions
from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.sim.budget import (
    ExporterView,
)
from runtime.sim.classes import (
    ClassTotals,
)
from runtime.sim.cluster_objects import Eviction, Waiting
from runtime.sim.counts import TokenCounts
from runtime.sim.production import ProductionRule
from runtime.sim.request_stream import Accepted, Requests, StepLatencies


@dataclass(frozen=True)
class Settings:
    """Replay knobs that are not policy: time, start-up, provisioning."""

    hours: float
    step_s: float = 15.0
    flex_startup_s: float = 300.0
    """Image pull + model load of a flex vLLM replica (``--startup-s``)."""
    production: ProductionRule = field(default_factory=ProductionRule)
    stack: StackOptions = DEFAULT_STACK
    """The stack's options the replay models: its node-pool target (Karpenter provisions
    nodes, ``karpenter_delay_s``) and the HPA tolerance the flex HPAs are rendered with."""
    karpenter_delay_s: float = 180.0
    """Karpenter: from a pending pod to a ready GPU node."""

    @property
    def steps(self) -> int:
        return round(self.hours * 3600 / self.step_s)


@dataclass(frozen=True)
class FlexInput:
    """One flex workload's demand and the numbers its vLLM plan and service model give."""

    workload: FlexWorkload
    requests: Requests | Accepted
    """Its stream, or the stream already split by its ``max_model_len`` (what the what-if
    passes, so that only the requests it serves stay in memory)."""
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

    @classmethod
    def empty(cls, layout: Layout, workloads: Iterable[str]) -> Series:
        """An empty recording with a column for every pool and every flex workload."""
        series = cls()
        for pool in layout.nodes:
            series.util_by_pool[pool] = []
            series.alloc_by_pool[pool] = []
            series.flex_by_pool[pool] = []
        for name in workloads:
            series.capped[name] = []
        return series

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
