"""The pooled replay's loop, one method per phase of a step (``runtime.sim.engine`` lists
them): start-ups and Karpenter, replicas, scheduling, serving, the exporters and the
budget, the HPAs, the tuner."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from infra.builders.workload import autoscaler
from policy.base import duration_seconds
from policy.pool import PoolPolicy
from policy.priorities import PriorityTier
from policy.workloads import FlexWorkload
from runtime.sim.budget import (
    ExporterView,
    Exports,
    PodState,
    budget,
    held,
    production_utilization,
    spare,
)
from runtime.sim.classes import (
    ClassPlan,
    record_shed,
)
from runtime.sim.cluster import Cluster
from runtime.sim.cluster_objects import Eviction, Node, Phase, Pod, Waiting
from runtime.sim.exporter_view import Tallies, exporter_view, pool_duty
from runtime.sim.fleet_pools import (
    ProductionPools,
    admission_of,
    build_fleet,
    close_fleets,
    consolidate_after,
    evaluation_every,
    pod_name,
    saturations,
    sheds,
    with_max_replicas,
)
from runtime.sim.hpa import HpaState, PodSample, reconcile
from runtime.sim.hpa_spec import HpaSpec
from runtime.sim.production import ProductionGroup, production_groups
from runtime.sim.replay_model import (
    FIRST_MINUTE_S,
    FleetState,
    FleetTotals,
    FlexInput,
    Layout,
    LoopState,
    Observer,
    Retune,
    Series,
    Settings,
    StepRecord,
    Tuning,
)
from runtime.sim.request_stream import StepResult
from runtime.sim.traces import ProductionTrace


class PooledLoop:
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
        self.cluster = _cluster(policy, layout, settings)
        self.workloads = {f.workload.name: f.workload for f in flex}
        self.fleets = {
            f.workload.name: build_fleet(policy, f, admission_of(classes, f)) for f in flex
        }
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
        self.pools = ProductionPools(policy, classes, self.groups)
        # Settled replicas per trace step: the trace rule's answer, and every group's start.
        self.settled = {g.owner: g.estimate(trace, settings.production) for g in self.groups}
        self.prod_spec = {owner: int(need[0]) for owner, need in self.settled.items()}
        self.prod_hpa_state = {g.owner: HpaState() for g in self.groups}
        self.prod_util = {g.owner: 0.0 for g in self.groups}
        self.identity = {g.owner: (g.namespace, g.pod_prefix) for g in self.groups} | {
            name: (policy.cluster.flex_namespace, name) for name in self.workloads
        }
        self.eval_every = evaluation_every(policy, settings)
        self.prod_pools = (policy.prod_pool.name, *(p.name for p in policy.flex_pools))
        self.series = Series.empty(layout, self.workloads)

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
        saturation = saturations(self.plan, self.fleets, running, self.pools, lent)
        tokens = 0
        for name, fleet in self.fleets.items():
            result = fleet.serve(
                now,
                self.settings.step_s,
                running[name],
                saturated=sheds(self.plan, name, saturation),
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
            view = exporter_view(c, now, util, self.spec, self.identity, self.pod_states)
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
                instances=tuple(pod_name(self.identity[name][1], uid) for uid in running),
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
        self.eval_every = evaluation_every(policy, self.settings)
        self.cluster.shutdown_s = policy.disruption.shutdown_budget_s
        self.cluster.pdb_min_available = policy.disruption.pdb_min_available

    def _autoscalers(self) -> None:
        """Each flex workload's HPA as rendered from ``self.policy``, bounded by the layout
        (which may raise a bound, never lower the policy's)."""
        for name, w in self.workloads.items():
            manifest = autoscaler(self.policy, w, self.settings.stack.hpa_tolerance)
            bound = max(self.layout.max_replicas[name], self.policy.replica_bound(w))
            self.hpas[name] = HpaSpec.from_manifest(with_max_replicas(manifest, bound))
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
        for pool, mean in pool_duty(c, self.prod_util | self.flex_util).items():
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
        close_fleets(self.fleets, self.totals, self.settings)
        self.class_totals = self.pools.close(self.fleets, self.settings)
        self.prod_totals = self.pools.totals
        return self.totals


def _cluster(policy: PoolPolicy, layout: Layout, settings: Settings) -> Cluster:
    """The layout's nodes (none at the start with Karpenter, which provisions them) under the
    policy's disruption settings."""
    karpenter = settings.stack.target == "karpenter"
    return Cluster(
        nodes={
            pool: [
                Node(f"{pool}-{i}", pool, layout.gpus_per_node[pool], layout.gpus_per_node[pool])
                for i in range(0 if karpenter else count)
            ]
            for pool, count in layout.nodes.items()
        },
        shutdown_s=policy.disruption.shutdown_budget_s,
        pdb_min_available=policy.disruption.pdb_min_available,
        karpenter_delay_s=settings.karpenter_delay_s if karpenter else None,
        max_nodes=dict(layout.nodes),
        gpus_per_node=dict(layout.gpus_per_node),
        consolidate_after_s=consolidate_after(policy),
    )
