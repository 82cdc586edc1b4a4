"""One what-if run: a policy, a production trace and flex demand -> pooled vs fixed summaries.

Pure apart from reading the workloads' model configs (``load_model_spec``). The pieces:
traces (``runtime.sim.traces``) -> request streams and the cluster layout -> the pooled
closed loop and the fixed-topology baseline (``runtime.sim.engine``) -> ``report.Summary``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from policy.pool import PoolPolicy
from policy.workloads import FlexWorkload
from runtime.sim.classes import ClassError, ClassPlan, ProductionDemand, Route, route
from runtime.sim.engine import replay_fixed, replay_pooled
from runtime.sim.goals import Goal, goals
from runtime.sim.production import ProductionGroup, describe, need_gpus, production_groups
from runtime.sim.replay_model import FlexInput, Layout, Progress, Replay, Settings
from runtime.sim.report import Summary, summarize
from runtime.sim.request_stream import Accepted, Requests
from runtime.sim.service_time import ServiceModel, service_model
from runtime.sim.traces import FlexTrace, ProductionTrace
from runtime.sim.tuning import TunerConfig, TunerLoop, TunerRun
from runtime.vllm import ModelSpec, load_model_spec, plan_kv_cache

LayoutMode = Literal["policy", "trace"]


class WhatIfError(ValueError):
    """Inputs that cannot be replayed as given; one line, with the numbers."""


@dataclass(frozen=True)
class Demand:
    """Flex demand of one workload: request traces (merged) and/or a backlog."""

    traces: tuple[FlexTrace, ...] = ()
    backlog: FlexTrace | None = None
    """Batch work that is always available; request lengths cycle through this trace."""
    rate_scale: float = 1.0
    trace_classes: tuple[str | None, ...] = ()
    """Traffic class each of ``traces`` names (``FILE:CLASS``), None: the default class; empty:
    every trace takes the default (``runtime.sim.classes.route``)."""
    backlog_class: str | None = None
    """Traffic class the backlog names; None: the default."""

    def classes_of_traces(self) -> tuple[str | None, ...]:
        """The class each trace names, None for the default (one per trace)."""
        if not self.trace_classes:
            return (None,) * len(self.traces)
        if len(self.trace_classes) != len(self.traces):
            raise ValueError("trace_classes must name one class (or None) per trace")
        return self.trace_classes


@dataclass(frozen=True)
class WhatIf:
    """Everything one replay pair needs besides the policy."""

    production: ProductionTrace
    demand: Mapping[str, Demand]
    settings: Settings
    layout: LayoutMode = "policy"
    fit_production: bool = False
    """Scale a production trace that outgrows the cluster down to fit (never silently)."""
    tuner: TunerConfig | None = None
    """Run the tuner's decisions in the pooled loop (``runtime.sim.tuning``); None: the
    policy stays as given for the whole replay."""


@dataclass(frozen=True)
class Result:
    pooled: Summary
    fixed: Summary
    replays: tuple[Replay, Replay]
    layout: Layout
    assumptions: tuple[str, ...]
    services: dict[str, str] = field(default_factory=dict)
    tuner: TunerRun | None = None
    """What the tuner proposed and merged in the pooled replay (``--tuner`` only)."""

    reserve_gpus: int = 0
    """GPUs the pools' reserves keep free with every node of the layout schedulable (the
    plots' reserve band)."""
    max_model_len: dict[str, int] = field(default_factory=dict)
    """Workload -> its ``max_model_len``: the cause of its dropped requests, for the report."""

    @property
    def useful_gpu_h_ratio(self) -> float:
        """Pooled over fixed useful GPU-hours (``report.Summary.useful_gpu_h``)."""
        base = self.fixed.useful_gpu_h
        return self.pooled.useful_gpu_h / base if base else math.inf

    @property
    def fixed_duty_cycle(self) -> float:
        """The fixed topology's cluster duty cycle (where the headline goal applies)."""
        return self.fixed.cluster_duty_cycle

    @property
    def production_to_flex(self) -> float:
        """GPUs production holds in the fixed topology per GPU left to flex there."""
        s = self.replays[1].series
        prod, total = s.prod_gpus[0], s.total_gpus[0]
        return prod / (total - prod) if total > prod else math.inf

    @property
    def goals(self) -> tuple[Goal, ...]:
        """The product's goals (``GOALS``), each with whether this replay met it."""
        return goals(self.pooled, self.fixed, self.useful_gpu_h_ratio)


@dataclass(frozen=True)
class _Inputs:
    """What both replays of one run need: the hardware, production, flex demand, classes."""

    layout: Layout
    trace: ProductionTrace
    flex: list[FlexInput]
    classes: ClassPlan | None
    services: dict[str, ServiceModel]
    models: dict[str, ModelSpec]
    groups: tuple[ProductionGroup, ...]


def run(
    policy: PoolPolicy, policy_dir: Path, whatif: WhatIf, *, progress: Progress | None = None
) -> Result:
    """Replay the policy's closed loop and the fixed baseline on the same demand."""
    inputs = _inputs(policy, policy_dir, whatif)
    settings, layout, classes = whatif.settings, inputs.layout, inputs.classes
    tuner = None if whatif.tuner is None else TunerLoop(whatif.tuner, inputs.models)
    pooled = replay_pooled(
        policy,
        layout,
        inputs.trace,
        inputs.flex,
        settings,
        progress=progress,
        tuning=tuner,
        classes=classes,
    )
    fixed = replay_fixed(policy, layout, inputs.trace, inputs.flex, settings, classes=classes)
    reserve_gpus = _reserve_gpus(policy, layout)
    return Result(
        summarize(pooled, policy, reserve_gpus=reserve_gpus),
        summarize(fixed, policy),  # no reserve: nothing moves there
        (pooled, fixed),
        layout,
        _assumptions(policy, whatif, inputs, tuner),
        {n: m.source for n, m in inputs.services.items()},
        None if tuner is None else tuner.run(pooled),
        reserve_gpus,
        {w.name: w.max_model_len for w in policy.workloads},
    )


def run_pooled(policy: PoolPolicy, policy_dir: Path, whatif: WhatIf) -> Summary:
    """The pooled replay alone (a sweep compares many policies with one fixed topology)."""
    inputs = _inputs(policy, policy_dir, whatif)
    pooled = replay_pooled(
        policy, inputs.layout, inputs.trace, inputs.flex, whatif.settings, classes=inputs.classes
    )
    return summarize(pooled, policy, reserve_gpus=_reserve_gpus(policy, inputs.layout))


def _check_demand(policy: PoolPolicy, whatif: WhatIf) -> None:
    """Refuse a replay with nothing to replay or demand for workloads the policy lacks."""
    if not policy.workloads:
        raise WhatIfError("the policy declares no flex workloads: there is nothing to replay")
    unknown = sorted(set(whatif.demand) - {w.name for w in policy.workloads})
    if unknown:
        raise WhatIfError(
            f"flex demand names unknown workloads {unknown}; "
            f"the policy has {[w.name for w in policy.workloads]}"
        )


def _inputs(policy: PoolPolicy, policy_dir: Path, whatif: WhatIf) -> _Inputs:
    """Check the demand against the policy, size the hardware, and build each workload's
    requests, KV plan and service model (reads the model configs)."""
    _check_demand(policy, whatif)
    settings = whatif.settings
    trace = whatif.production
    groups = production_groups(policy, settings.production)
    need = need_gpus(groups, trace, settings.production)
    layout = _layout(policy, trace, need, whatif)
    trace = _fit(trace, need, layout, whatif)
    horizon = settings.hours * 3600
    flex: list[FlexInput] = []
    services: dict[str, ServiceModel] = {}
    models: dict[str, ModelSpec] = {}
    flex_pools: dict[str, str] = {}
    production: dict[str, list[ProductionDemand]] = {}
    for w in policy.workloads:
        spec = load_model_spec(policy_dir / w.hf_config)
        models[w.name] = spec
        plan = plan_kv_cache(policy, w, spec)
        pool = policy.pool_of(w)
        model = service_model(
            gpu_product=pool.gpu_model,
            model_id=w.model,
            spec=spec,
            tp=w.gpus_per_replica,
            max_context=w.max_model_len,
        )
        services[w.name] = model
        demand = whatif.demand.get(w.name, Demand())
        routed = _routes(policy, w, demand)
        on_flex = [(t, r) for t, r in routed if r is None or r.pool.tier == "flex"]
        requests = _requests(demand, on_flex, horizon)
        if any(r is not None for _, r in on_flex):
            flex_pools[w.name] = next(r.pool.name for _, r in on_flex if r is not None)
        for t, r in routed:
            if r is not None and r.pool.tier == "production":
                production.setdefault(r.pool.name, []).append(
                    ProductionDemand(
                        pool=r.pool.name,
                        namespace=r.pool.namespace,
                        requests=_classed(t.tiled(horizon, demand.rate_scale), r),
                        latencies=model,
                        kv_tokens=plan.max_concurrent_tokens,
                        max_num_seqs=w.max_num_seqs,
                        max_model_len=w.max_model_len,
                        replica_gpus=w.gpus_per_replica,
                    )
                )
        window = layout.max_replicas[w.name] * w.max_num_seqs * 2 if demand.backlog else 0
        accepted = Accepted.split(requests, w.max_model_len)
        flex.append(FlexInput(w, accepted, plan.max_concurrent_tokens, model, window))
    classes = _class_plan(policy, flex_pools, production)
    return _Inputs(layout, trace, flex, classes, services, models, groups)


def _assumptions(
    policy: PoolPolicy, whatif: WhatIf, inputs: _Inputs, tuner: TunerLoop | None
) -> tuple[str, ...]:
    """What the report says it assumed: service times, production, layout, settings."""
    settings, layout, classes = whatif.settings, inputs.layout, inputs.classes
    return (
        *(f"service times of {n}: {m.source}" for n, m in inputs.services.items()),
        f"production: {describe(inputs.groups, settings.production)}; new replicas start in "
        f"{settings.production.startup_s:g} s",
        f"flex replicas start in {settings.flex_startup_s:g} s (image pull + model load)",
        f"layout: {_layout_text(policy, layout, whatif.layout)}",
        *(
            []
            if whatif.layout == "policy"
            else [
                f"--layout trace resizes the hardware: the replay's cluster has "
                f"{layout.total_gpus} GPUs, the policy declares "
                f"{Layout.of_policy(policy).total_gpus}; the figures are of that cluster, "
                "not the policy's"
            ]
        ),
        "figures in GPU-hours (useful = production's served busy GPU-hours + flex's busy "
        "GPU-hours); the baseline is the fixed topology on the same hardware",
        f"step {settings.step_s:g} s; budget every {policy.metrics.evaluation_interval}; "
        f"HPA tolerance {settings.stack.hpa_tolerance}; target {settings.stack.target}"
        + (
            f" (node ready {settings.karpenter_delay_s:g} s after the request)"
            if settings.stack.target == "karpenter"
            else ""
        ),
        "flex serving: fluid continuous-batching model (runtime/sim/serving.py)",
        *([] if classes is None else [_classes_text(classes)]),
        *([] if tuner is None else [_tuner_text(tuner)]),
    )


def _tuner_text(tuner: TunerLoop) -> str:
    s = tuner.settings
    return (
        f"tuner in the pooled loop: decisions.decide every {s.interval} on the last {s.window} "
        f"of the replay's recorded series, proposals merged {tuner.delay_s:g} s after they are "
        f"made (cooldown {s.cooldown}); the summary figures are of the policy as it evolved, "
        "the fixed topology has no tuner"
    )


def _reserve_gpus(policy: PoolPolicy, layout: Layout) -> int:
    """GPUs the pools' reserves keep free with every node of ``layout`` schedulable."""
    return sum(
        policy.reserve_of(pool).gpus(layout.nodes[pool.name] * layout.gpus_per_node[pool.name])
        for pool in policy.node_pools
        if pool.name in layout.nodes
    )


def _routes(
    policy: PoolPolicy, workload: FlexWorkload, demand: Demand
) -> list[tuple[FlexTrace, Route | None]]:
    """Each trace of ``demand`` (the backlog alone, if it has one) with its route."""
    try:
        if demand.backlog is not None:
            if demand.traces:
                raise WhatIfError("a workload takes either request traces or a backlog, not both")
            chosen = route(policy, workload, demand.backlog_class)
            if chosen is not None and chosen.pool.tier != "flex":
                raise WhatIfError(
                    f"the backlog for {workload.name} names class {demand.backlog_class!r}, "
                    "served by production instances; a backlog is batch work for flex: expected "
                    "a class served by flex"
                )
            return [(demand.backlog, chosen)]
        names = demand.classes_of_traces()
        return [(t, route(policy, workload, n)) for t, n in zip(demand.traces, names, strict=True)]
    except ClassError as exc:
        raise WhatIfError(str(exc)) from None


def _requests(
    demand: Demand, routed: list[tuple[FlexTrace, Route | None]], horizon_s: float
) -> Requests:
    """The workload's own stream: its backlog, or its traces served by flex, merged."""
    if demand.backlog is not None:
        ((backlog, chosen),) = routed
        return _classed(_to_requests(backlog, backlog=True), chosen)
    if not routed:
        return _to_requests(None, backlog=False)
    return Requests.merge(
        [
            _classed(_to_requests(t.tiled(horizon_s, demand.rate_scale), backlog=False), r)
            for t, r in routed
        ]
    )


def _classed(stream: FlexTrace | Requests, chosen: Route | None) -> Requests:
    """``stream`` with every request in ``chosen``'s traffic class (unchanged without one)."""
    requests = _to_requests(stream, backlog=False) if isinstance(stream, FlexTrace) else stream
    if chosen is None:
        return requests
    return replace(
        requests, traffic_class=np.full(len(requests), chosen.traffic_class, dtype=np.int64)
    )


def _class_plan(
    policy: PoolPolicy, flex_pools: dict[str, str], production: dict[str, list[ProductionDemand]]
) -> ClassPlan | None:
    """The traffic classes of this replay (None without any routed demand)."""
    if policy.serving is None or not (flex_pools or production):
        return None
    merged = []
    for parts in production.values():
        first = parts[0]
        merged.append(replace(first, requests=Requests.merge([p.requests for p in parts])))
    return ClassPlan.of_policy(policy, flex_pools, tuple(merged))


def _classes_text(plan: ClassPlan) -> str:
    """The report's assumption line for traffic classes: what the replay decides with."""
    classes = ", ".join(
        f"{c.name} ({c.priority}, {c.served_by}{', sheddable' if c.sheddable else ''})"
        for c in plan.classes
    )
    pools = sorted({*plan.flex_pools.values(), *(d.pool for d in plan.production)})
    return (
        f"traffic classes {classes} through pools {', '.join(pools)}: the endpoint picker sheds "
        "sheddable arrivals while its pool's saturation (mean over ready instances of max("
        f"waiting / {plan.detector.queue_depth}, KV usage / {plan.detector.kv_usage:g})) is "
        "at least 1 or no instance is ready, read every step; requests in flight on an exiting "
        f"pod finish within {plan.drain_window_s:g} s (preStop + drain) or are lost; "
        "production instances lend their classes the GPU time production's trace leaves idle "
        "(not fed back into production's duty)"
    )


def _to_requests(trace: FlexTrace | None, *, backlog: bool) -> Requests:
    if trace is None:
        empty_i = np.empty(0, dtype=np.int64)
        return Requests(
            np.empty(0), empty_i, empty_i, empty_i, np.empty(0), np.empty(0, dtype=bool)
        )
    n = trace.arrival_s.size
    if backlog:
        return Requests(
            np.zeros(n),
            np.asarray(trace.input_tokens, dtype=np.int64),
            np.asarray(trace.output_tokens, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.full(n, np.nan),
            np.zeros(n, dtype=bool),
            backlog=True,
        )
    return Requests(
        np.asarray(trace.arrival_s, dtype=np.float64),
        np.asarray(trace.input_tokens, dtype=np.int64),
        np.asarray(trace.output_tokens, dtype=np.int64),
        np.asarray(trace.prefix_blocks, dtype=np.int64) * trace.block_tokens,
        np.asarray(trace.prefix_last_seen, dtype=np.float64),
        np.full(n, trace.block_tokens > 0),
    )


def _layout(
    policy: PoolPolicy, production: ProductionTrace, need: NDArray[np.int64], whatif: WhatIf
) -> Layout:
    """The replay's hardware; ``need`` is production's settled GPU need per trace step."""
    declared = Layout.of_policy(policy)
    if whatif.layout == "policy":
        return declared
    prod = policy.prod_pool
    flex_pool = policy.flex_pools[0]
    peak_nodes = math.ceil(int(production.held.max()) / prod.gpus_per_node)
    prod_nodes = max(1, math.ceil(float(np.median(need)) / prod.gpus_per_node))
    nodes = dict(declared.nodes)
    nodes[prod.name] = prod_nodes
    nodes[flex_pool.name] = flex_pool.max_nodes + max(0, peak_nodes - prod_nodes)
    max_replicas = dict(declared.max_replicas)
    for w in policy.workloads:
        if w.pool == flex_pool.name:
            sharing = sum(1 for x in policy.workloads if x.pool == w.pool)
            fits = nodes[w.pool] * flex_pool.gpus_per_node // w.gpus_per_replica // sharing
            max_replicas[w.name] = max(policy.replica_bound(w), fits)
    return Layout(nodes, declared.gpus_per_node, max_replicas)


def _fit(
    production: ProductionTrace, settled: NDArray[np.int64], layout: Layout, whatif: WhatIf
) -> ProductionTrace:
    """Refuse a production trace that outgrows the cluster, or scale it when asked to."""
    capacity = layout.total_gpus
    need = np.maximum(production.held, settled)
    worst = int(np.argmax(need))
    if need[worst] <= capacity:
        return production
    if not whatif.fit_production:
        pools = ", ".join(f"{p} {layout.nodes[p] * layout.gpus_per_node[p]}" for p in layout.nodes)
        raise WhatIfError(
            f"{production.source}: at minute {worst * production.step_s / 60:.0f} production "
            f"holds {int(production.held[worst])} GPUs (needs {int(need[worst])}) but the "
            f"cluster has {capacity} ({pools}); size the pools or replay with --fit-production "
            "to scale the trace to the cluster"
        )
    factor = capacity / float(need[worst])
    held = np.floor(production.held * factor).astype(np.int64)
    busy = np.minimum(production.busy * factor, held.astype(np.float64))
    return replace(production, source=f"{production.source} x{factor:.3f}", held=held, busy=busy)


def _layout_text(policy: PoolPolicy, layout: Layout, mode: LayoutMode) -> str:
    pools = ", ".join(
        f"{p} {layout.nodes[p]} x {layout.gpus_per_node[p]} GPUs" for p in layout.nodes
    )
    bounds = ", ".join(f"{w} max {n}" for w, n in layout.max_replicas.items())
    if mode == "policy":
        return f"the policy's pools ({pools}); {bounds}"
    return (
        f"sized to the trace ({pools}: production's peak plus the policy's flex pool, "
        f"gpu-prod holding production's median need); {bounds}"
    )
