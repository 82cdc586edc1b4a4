"""Traffic classes in the replay: the policy's ``serving`` section routed and shed as deployed.

With a ``serving`` section every flex request trace (or backlog) belongs to a traffic class
(``--flex-trace FILE:CLASS``; by default the first class the policy serves by flex, which the
policy requires to be sheddable). The class's ``served_by`` tier decides which instances serve
it, through the same pools gpupool renders (``infra.builders.serving_pools.pools``): a flex
class goes to the workload's fleet, a production class to the production instances of the
workload's model (``serving.models[].production``), which lend it the GPU time production's own
trace leaves idle.

In front of every pool the endpoint picker's saturation detector (the ``utilization-detector``
plugin gpupool renders, with the thresholds of
``infra.builders.endpoint_picker.endpoint_picker_config``) scores each ready instance
``max(waiting / queueDepthThreshold, KV usage / kvCacheUtilThreshold)``; the pool's
saturation is their mean, 1.0 with no ready instance (fail closed), and at 1.0 or more a
sheddable request (priority below 0) is refused: the client gets 429/503 (GIE's legacy
admission, flow control off). A non-sheddable request is never refused
for saturation: it queues. The replay reads the detector once per step (15 s) on the state the
last step left, with the instances ready now (a pod being deleted has left the endpoints);
the picker polls every 50 ms, so its metrics never count as stale here.

Pods that exit (preemption or scale-down) follow the shutdown sequence (docs/preservation.md,
"Eviction"): endpoints drop the pod while its preStop sleeps ``prestop_delay_s``, then vLLM
drains in-flight requests for up to ``drain_s``; a request in flight on it finishes if it needs
no more than that window, else it is aborted (lost). Without a ``serving`` section nothing here
runs: the replay and its outputs are what they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from infra.builders.endpoint_picker import DETECTOR, endpoint_picker_config
from infra.builders.serving_options import DEFAULT_SERVING
from infra.builders.serving_pools import Pool, pools, served_model
from policy.pool import PoolPolicy
from policy.serving import Tier
from policy.workloads import FlexWorkload
from runtime.sim.request_stream import Admission, ClassCounts, Requests, StepLatencies
from runtime.sim.serving import Fleet


class ClassError(ValueError):
    """A trace's traffic class cannot be routed under the policy; one line, with the names."""


@dataclass(frozen=True)
class Detector:
    """The saturation detector's thresholds as the endpoint picker is configured with them."""

    queue_depth: int
    """``queueDepthThreshold``: waiting requests at which an instance scores 1."""
    kv_usage: float
    """``kvCacheUtilThreshold``: KV-cache usage at which an instance scores 1."""

    @classmethod
    def of_policy(cls, policy: PoolPolicy) -> Detector:
        """Read from the EndpointPickerConfig gpupool renders (both distributions get the same
        detector parameters), so the replay sheds at the deployed numbers."""
        config = endpoint_picker_config(policy, DEFAULT_SERVING.objective_api)
        (plugin,) = (p for p in config["plugins"] if p["type"] == DETECTOR)
        given = plugin["parameters"]
        return cls(int(given["queueDepthThreshold"]), float(given["kvCacheUtilThreshold"]))

    def score(self, waiting: float, kv_usage: float) -> float:
        """One ready instance's saturation score (1 or more: saturated)."""
        return max(waiting / self.queue_depth, kv_usage / self.kv_usage)


@dataclass(frozen=True)
class Member:
    """Ready instances of one fleet of a pool, and what their metrics read."""

    pool: str
    instances: float
    waiting: float
    """Waiting requests over all of them."""
    kv_usage: float
    """KV usage of each (the fluid model keeps them equal)."""


def pool_saturation(members: Iterable[Member], detector: Detector) -> dict[str, float]:
    """Each pool's saturation: the mean score of its ready instances, 1.0 without any."""
    weight: dict[str, float] = {}
    total: dict[str, float] = {}
    for m in members:
        weight.setdefault(m.pool, 0.0)
        total.setdefault(m.pool, 0.0)
        if m.instances > 0:
            weight[m.pool] += m.instances
            total[m.pool] += m.instances * detector.score(m.waiting / m.instances, m.kv_usage)
    return {pool: total[pool] / w if w > 0 else 1.0 for pool, w in weight.items()}


@dataclass(frozen=True)
class ReplayClass:
    """A traffic class as the replay accounts for it."""

    name: str
    priority: int
    served_by: Tier
    sheddable: bool


@dataclass(frozen=True)
class Route:
    """Where one trace's requests go: their class (index in ``ClassPlan.classes``) and pool."""

    traffic_class: int
    pool: Pool


def replay_classes(policy: PoolPolicy) -> tuple[ReplayClass, ...]:
    """The policy's traffic classes in its order (empty without a ``serving`` section)."""
    if policy.serving is None:
        return ()
    return tuple(
        ReplayClass(c.name, c.priority, c.served_by, c.sheddable)
        for c in policy.serving.traffic_classes
    )


def route(policy: PoolPolicy, workload: FlexWorkload, name: str | None) -> Route | None:
    """The class and pool of a trace sent to ``workload`` naming class ``name`` (None: the
    default). None: the trace is replayed without a class (no ``serving`` section, or a
    workload no pool serves, for a trace that names no class)."""
    serving = policy.serving
    if serving is None:
        if name is not None:
            raise ClassError(
                f"a trace for {workload.name} names traffic class {name!r} but the policy has "
                "no serving section; expected no class, or a policy with serving.traffic_classes"
            )
        return None
    model = served_model(policy, workload)
    tiers = {p.tier: p for p in pools(policy) if model is not None and p.model == model}
    classes = serving.traffic_classes
    if name is None:
        flex = tiers.get("flex")
        if flex is None:
            return None
        return Route(classes.index(flex.classes[0]), flex)
    found = [i for i, c in enumerate(classes) if c.name == name]
    if not found:
        raise ClassError(
            f"traffic class {name!r} is not in serving.traffic_classes {[c.name for c in classes]}"
        )
    chosen = classes[found[0]]
    if model is None:
        raise ClassError(
            f"a trace for {workload.name} names traffic class {name!r}, but no serving.models "
            f"entry serves its model {workload.model!r}: no pool routes to it"
        )
    pool = tiers.get(chosen.served_by)
    if pool is None:
        raise ClassError(
            f"traffic class {name!r} is served by {chosen.served_by} instances, but served "
            f"model {model.name!r} has none (serving.models[].production); expected a class "
            "its pools serve"
        )
    return Route(found[0], pool)


@dataclass(frozen=True)
class ProductionDemand:
    """Requests of production-served classes of one model, on its production instances."""

    pool: str
    """The pool (``<model>-production``)."""
    namespace: str
    """Where its instances run (``serving.models[].production.namespace``)."""
    requests: Requests
    latencies: StepLatencies
    """Service times of the model, from the flex workload the traces were sent to."""
    kv_tokens: int
    max_num_seqs: int
    max_model_len: int
    replica_gpus: int
    """GPUs of one replica of that service model: production lends GPU time in these units."""


@dataclass(frozen=True)
class ClassPlan:
    """The replay's traffic classes and how every pool admits them."""

    classes: tuple[ReplayClass, ...]
    detector: Detector
    drain_window_s: float
    """``disruption.prestop_delay_s + drain_s``: what a request in flight on an exiting pod
    has to finish."""
    flex_pools: Mapping[str, str]
    """Flex workload -> its pool, for every workload whose demand has classes."""
    production: tuple[ProductionDemand, ...] = ()

    @classmethod
    def of_policy(
        cls,
        policy: PoolPolicy,
        flex_pools: Mapping[str, str],
        production: tuple[ProductionDemand, ...] = (),
    ) -> ClassPlan:
        """The plan of ``policy``: its classes, its picker's detector, its pods' drain window."""
        d = policy.disruption
        return cls(
            replay_classes(policy),
            Detector.of_policy(policy),
            float(d.prestop_delay_s + d.drain_s),
            dict(flex_pools),
            production,
        )

    @property
    def admission(self) -> Admission:
        """What every fleet behind a picker needs: which class indices are sheddable."""
        return Admission(
            np.array([c.sheddable for c in self.classes], dtype=bool), self.drain_window_s
        )

    def fleet(self, demand: ProductionDemand, preservation: bool) -> Fleet:
        """The fleet of ``demand`` behind its pool's picker."""
        return Fleet.admit(
            demand.requests,
            max_model_len=demand.max_model_len,
            latencies=demand.latencies,
            kv_tokens=demand.kv_tokens,
            max_num_seqs=demand.max_num_seqs,
            preservation=preservation,
            admission=self.admission,
        )


@dataclass
class ClassTotals:
    """One traffic class over a replay: ``arrived == served + queued + shed + dropped +
    lost``."""

    name: str
    priority: int
    served_by: Tier
    sheddable: bool
    arrived: int = 0
    served: int = 0
    """Completed (drained requests of exiting pods included)."""
    queued: int = 0
    """Admitted and not finished when the replay ended."""
    shed: int = 0
    """Refused by the endpoint picker (429/503): sheddable, arriving while the pool was
    saturated or had no ready instance."""
    dropped: int = 0
    """Longer than ``max_model_len`` (vLLM rejects them)."""
    lost: int = 0
    """In flight on a pod that exited and not finished within its drain window."""
    drained: int = 0
    """In flight on a pod that exited and finished within its drain window."""
    shed_by_step: list[int] = field(default_factory=list)
    """Requests shed in each replay step."""

    def add(self, counts: ClassCounts, index: int) -> None:
        """Add one fleet's counts of this class (a class may reach several fleets)."""
        self.arrived += int(counts.arrived[index])
        self.served += int(counts.served[index])
        self.queued += int(counts.queued[index])
        self.shed += int(counts.shed[index])
        self.dropped += int(counts.dropped[index])
        self.lost += int(counts.lost[index])
        self.drained += int(counts.drained[index])


def new_totals(plan: ClassPlan) -> dict[str, ClassTotals]:
    """Empty totals of every class of the policy, so a class no trace used reports zeros."""
    return {c.name: ClassTotals(c.name, c.priority, c.served_by, c.sheddable) for c in plan.classes}


def record_shed(totals: dict[str, ClassTotals], fleets: Iterable[Fleet], plan: ClassPlan) -> None:
    """Append this step's shed requests of every class (over the fleets with admission)."""
    step = np.zeros(len(plan.classes), dtype=np.int64)
    for fleet in fleets:
        if fleet.admission is not None:
            step += fleet.step_shed
    for c, n in zip(plan.classes, step, strict=True):
        totals[c.name].shed_by_step.append(int(n))


def close_totals(
    totals: dict[str, ClassTotals], fleets: Iterable[Fleet], plan: ClassPlan, end: float
) -> dict[str, ClassTotals]:
    """Add every fleet's end-of-replay counts; classes no trace used stay at 0."""
    for fleet in fleets:
        if fleet.admission is None:
            continue
        counts = fleet.class_counts(end)
        for i, c in enumerate(plan.classes):
            totals[c.name].add(counts, i)
    return totals
