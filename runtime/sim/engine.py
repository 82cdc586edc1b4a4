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

from policy.pool import PoolPolicy
from runtime.sim.classes import (
    ClassPlan,
    record_shed,
)
from runtime.sim.cluster_objects import Waiting
from runtime.sim.fleet_pools import (
    ProductionPools,
    admission_of,
    build_fleet,
    close_fleets,
    saturations,
    sheds,
)
from runtime.sim.pooled_loop import PooledLoop
from runtime.sim.production import production_groups
from runtime.sim.replay_model import (
    FleetTotals,
    FlexInput,
    Layout,
    Observer,
    Progress,
    Replay,
    Series,
    Settings,
    Tuning,
)
from runtime.sim.traces import ProductionTrace


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
    loop = PooledLoop(policy, layout, trace, flex, settings, observe, tuning, classes)
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
    replicas = _fixed_replicas(flex, max(0, total - prod_gpus))
    fleets = {f.workload.name: build_fleet(policy, f, admission_of(classes, f)) for f in flex}
    totals = {name: FleetTotals() for name in fleets}
    pools = ProductionPools(policy, classes, production_groups(policy, settings.production))
    series = Series(
        util_by_pool={"production": [], "flex": []}, alloc_by_pool={"production": [], "flex": []}
    )
    flex_gpus = sum(replicas[f.workload.name] * f.workload.gpus_per_replica for f in flex)
    for step in range(settings.steps):
        now = step * settings.step_s
        _held, busy = trace.at(now)
        util = float(busy) / prod_gpus if prod_gpus else 0.0
        lent = {
            pool: pools.fixed(pool, prod_gpus, util) for pool in pools.fleets
        }  # (instances, idle GPUs) of each production pool
        saturation = saturations(classes, fleets, replicas, pools, lent)
        tokens, duty = 0, 0.0
        for f in flex:
            name = f.workload.name
            result = fleets[name].serve(
                now, settings.step_s, replicas[name], saturated=sheds(classes, name, saturation)
            )
            totals[name].add(result)
            tokens += result.output_tokens
            duty += result.busy * replicas[name] * f.workload.gpus_per_replica
        pools.serve(now, settings.step_s, lent, saturation)
        if classes is not None:
            record_shed(pools.class_totals, [*fleets.values(), *pools.fleets.values()], classes)
        _record_fixed(series, now, total, prod_gpus, float(busy), flex_gpus, duty, tokens)
    close_fleets(fleets, totals, settings)
    return Replay(
        "fixed",
        settings.step_s,
        series,
        totals,
        pools.close(fleets, settings),
        pools.totals,
    )


def _fixed_replicas(flex: list[FlexInput], spare: int) -> dict[str, int]:
    """Each workload's replicas on the ``spare`` GPUs no production instance ever holds:
    split evenly between the workloads, in whole replicas."""
    replicas: dict[str, int] = {}
    for left, f in zip(range(len(flex), 0, -1), flex, strict=True):
        n = spare // left // f.workload.gpus_per_replica
        replicas[f.workload.name] = n
        spare -= n * f.workload.gpus_per_replica
    return replicas


def _record_fixed(
    series: Series,
    now: float,
    total: int,
    prod_gpus: int,
    busy: float,
    flex_gpus: int,
    duty: float,
    tokens: int,
) -> None:
    """One step of the fixed topology: nothing pending, evicted or shed."""
    series.append(
        t=now,
        prod_need=prod_gpus,
        prod_gpus=prod_gpus,
        prod_pending=0,
        prod_wait_max_s=0.0,
        prod_busy_served=busy,
        prod_busy=busy,
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
    series.util_by_pool["production"].append(busy / prod_gpus if prod_gpus else 0.0)
    series.util_by_pool["flex"].append(duty / flex_gpus if flex_gpus else 0.0)
    series.alloc_by_pool["production"].append(prod_gpus / total if total else 0.0)
    series.alloc_by_pool["flex"].append(flex_gpus / total if total else 0.0)
    for cause in Waiting:
        series.prod_pending_by_cause[cause].append(0)
