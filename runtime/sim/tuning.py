"""The tuner in the what-if loop (``gpupool whatif --tuner``): the real decisions, fed the
replay's own exporter view, merged after a review delay.

At every budget evaluation the replay hands its state (``replay_model.LoopState``) to
``TunerLoop.observe``. ``recorded`` (pure) turns that state into what the shipped recording
rules of the tuner's series (``signals.SIGNALS``) would record at that instant: the same
names and label sets Prometheus returns to ``runtime.tuner.prometheus.fetch_snapshot``.
Every ``interval`` of the tuner's settings a cycle reads the last ``window`` of those samples
into a ``MetricsSnapshot`` with the tuner's own ``signals.snapshot_of`` and calls
``decisions.decide`` with the policy in force, the tuner's state and the workloads' model
configs, as ``runtime.tuner.cycle`` does. A proposal waits ``review_delay_s`` (a person
reviews and merges the pull request); it is then applied to the policy in force by
``levers.apply_changes``, which validates it, and the workloads' vLLM plans are sized
again. A proposal whose "before" values no longer match the policy (another change was merged
first: a conflict), or that the policy's invariants or the vLLM plan refuse, is recorded as
refused and changes nothing. The replay adopts a merged policy from its next step
(``pooled_loop.PooledLoop.adopt``).

What the replay does not know it does not report: hit rates exist only for requests with
block hashes (Mooncake), vLLM labels other than ``namespace``, ``pod``, the workload label
and ``engine`` are left out, and compaction requests are counted, not served.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from policy import PolicyError, PoolPolicy
from policy.base import duration_seconds
from runtime.metrics import catalogue
from runtime.metrics.evictions import canonical_reason, canonical_reasons
from runtime.sim.budget import headroom, production_utilization
from runtime.sim.replay_model import LoopState, Replay, Retune
from runtime.tuner.decisions import decide
from runtime.tuner.levers import apply_changes
from runtime.tuner.proposals import Change, NoOp, Proposal, TunerState
from runtime.tuner.settings import TunerSettings
from runtime.tuner.signals import SIGNALS, snapshot_of
from runtime.tuner.snapshot import Labels, MetricsSnapshot, Series
from runtime.vllm import BackendError, KvPlanError, ModelSpec, plan_kv_cache

Sample = tuple[Labels, float]
"""One label set of a recorded series and its value at one evaluation."""

VLLM_ENGINE = "0"
"""vLLM's ``engine`` label: one engine per flex pod."""


def _labels(pairs: Mapping[str, str]) -> Labels:
    """Label pairs sorted by name, as ``prometheus.fetch_snapshot`` keeps them."""
    return tuple(sorted(pairs.items()))


def recorded(state: LoopState, earlier: LoopState | None) -> dict[str, list[Sample]]:
    """Every series of ``SIGNALS`` as the policy's recording rules would record it from the
    exporters at ``state.at``; a series the rule would not record is an empty list.

    ``earlier``: the oldest state within ``metrics.rate_window`` before ``state`` (the
    hit rate's ``rate()`` is taken from it); None, or ``state`` itself, gives no hit rate.
    The budget's series come from ``runtime.sim.budget`` (proven equal to the catalogue's
    PromQL); the others follow the catalogue's queries term by term (their docstrings).
    """
    policy, view = state.policy, state.view
    m, ns = policy.metrics, policy.cluster.flex_namespace
    out: dict[str, list[Sample]] = {name: [] for name in SIGNALS}
    # sum() / sum(): no labels; absent where production's GPUs have no duty series.
    utilization = production_utilization(policy, view)
    if utilization is not None:
        out[catalogue.PRODUCTION_GPU_UTILIZATION].append(((), utilization))
    out[catalogue.FLEX_EVICTIONS] = _evictions(state)
    # count(unschedulable production pods) or 0 * count(kube_pod_info): no labels.
    if view.pods:
        waiting = sum(1 for p in view.pods if p.production and p.node is None)
        out[catalogue.PROD_PODS_PENDING].append(((), float(waiting)))
    for pool in policy.harvest_pools:
        room = headroom(policy, pool, view)
        if room is not None:
            out[catalogue.FLEX_HEADROOM_GPUS].append((_labels({"pool": pool.name}), room))
    window_s = duration_seconds(m.rate_window)
    floor = policy.alerting.thresholds.kv_hit_rate.min_queried_tokens_per_s
    for w in policy.workloads:
        fleet = state.fleets[w.name]
        at_max = float(fleet.current_replicas >= fleet.max_replicas)
        hpa = {"namespace": ns, "horizontalpodautoscaler": fleet.hpa}
        out[catalogue.FLEX_HPA_AT_MAX].append(
            (_labels({**hpa, catalogue.BUDGET_LABEL: fleet.hpa}), at_max)
        )
        if not fleet.instances:  # no vLLM target: no vllm:* series for this workload
            continue
        queue = _labels({"namespace": ns, m.workload_label: w.name})
        out[catalogue.VLLM_QUEUE_DEPTH].append((queue, fleet.waiting))
        instances = [_instance(policy, w.name, pod) for pod in fleet.instances]
        out[catalogue.KV_CACHE_USAGE] += [(labels, fleet.kv_usage) for labels in instances]
        if earlier is None or earlier.at >= state.at or state.at - earlier.at > window_s:
            continue
        before = earlier.fleets[w.name]
        queried = fleet.query_tokens - before.query_tokens
        per_instance_s = queried / (state.at - earlier.at) / len(instances)
        if (per_instance_s >= floor) if floor > 0 else (per_instance_s > 0):
            rate = (fleet.hit_tokens - before.hit_tokens) / queried
            out[catalogue.KV_CACHE_HIT_RATE] += [(labels, rate) for labels in instances]
    return out


def _instance(policy: PoolPolicy, workload: str, pod: str) -> Labels:
    """The ``metrics.instance_labels`` of one flex vLLM instance (labels the replay does not
    know are left out, as ``by (...)`` drops a label its series lack)."""
    known = {
        "namespace": policy.cluster.flex_namespace,
        "pod": pod,
        policy.metrics.workload_label: workload,
        "engine": VLLM_ENGINE,
    }
    return _labels({k: known[k] for k in policy.metrics.instance_labels if k in known})


def _evictions(state: LoopState) -> list[Sample]:
    """``gpupool:flex_evictions:per_minute{namespace, reason}``: flex pods first disrupted
    within the rate window (``state.evictions``) per minute, by canonical reason, of the raw
    reasons the policy lists; a 0 row for every canonical reason while the flex namespace
    has pods."""
    policy = state.policy
    m, ns = policy.metrics, policy.cluster.flex_namespace
    window_s = duration_seconds(m.rate_window)
    listed = {*m.eviction_reasons, *m.disruption_reasons}
    counts = Counter(canonical_reason(raw) for _, raw in state.evictions if raw in listed)
    reasons = canonical_reasons(policy)
    if not any(p.namespace == ns for p in state.view.pods):
        reasons = [r for r in reasons if counts[r]]
    minutes = window_s / 60
    return [(_labels({"namespace": ns, "reason": r}), counts[r] / minutes) for r in reasons]


@dataclass(frozen=True)
class TunerConfig:
    """How the tuner runs inside a replay."""

    settings: TunerSettings = field(default_factory=TunerSettings)
    """The tuner's own settings (``gpupool tune --settings``): interval, window, steps."""
    review_delay_s: float | None = None
    """From a proposal to its merge; None: one tuner interval."""

    @property
    def delay_s(self) -> float:
        return self.settings.interval_s if self.review_delay_s is None else self.review_delay_s


@dataclass(frozen=True)
class Span:
    """The replay's figures over one stretch of simulated time (before or after a merge)."""

    start_s: float
    end_s: float
    evictions_per_minute: float
    """Flex pods disrupted per minute, on average over the stretch."""
    prod_unmet_pod_minutes_per_hour: float
    """Production pod-minutes pending per hour of the stretch."""
    flex_gpus_mean: float
    """GPUs held by running flex replicas, on average."""
    flex_tokens_per_s: float


@dataclass(frozen=True)
class ChangeRecord:
    field: str
    before: float
    after: float
    lever: str


Outcome = Literal["applied", "refused", "in review"]


@dataclass(frozen=True)
class ProposalRecord:
    """One proposal of the tuner in the replay, and what became of it."""

    rule: str
    title: str
    changes: tuple[ChangeRecord, ...]
    why: str
    """The decision's own rationale."""
    expected_effect: str
    proposed_at_s: float
    review_due_s: float
    outcome: Outcome
    """``in review`` when the replay ended before its merge."""
    decided_at_s: float | None = None
    refusal: str | None = None
    before: Span | None = None
    """The replay's figures from the previous merge (or the start) to this one."""
    after: Span | None = None
    """From this merge to the next (or the end)."""


@dataclass(frozen=True)
class TunerRun:
    """What the tuner did in one replay."""

    interval_s: float
    review_delay_s: float
    cycles: int
    proposals: tuple[ProposalRecord, ...]
    compaction_requests: int
    """Compaction requests decided (counted only: compaction is not modelled)."""
    last_noops: tuple[str, ...]
    """``rule: reason`` of every rule that decided nothing in the last cycle."""


@dataclass
class _Entry:
    proposal: Proposal
    proposed_at: float
    due_at: float
    outcome: Outcome = "in review"
    decided_at: float | None = None
    refusal: str | None = None


def _value_at(policy: PoolPolicy, change: Change) -> Any:
    node: Any = policy.model_dump(mode="json", by_alias=True)
    for part in change.path:
        node = node[part]
    return node


def merge(
    policy: PoolPolicy, changes: Sequence[Change], models: Mapping[str, ModelSpec]
) -> Retune | str:
    """``policy`` with ``changes`` merged and each workload's KV tokens under it, or why the
    merge is refused: a "before" that is no longer the policy's value, an invariant the
    policy's validation names, or a vLLM plan that no longer fits."""
    for change in changes:
        now = _value_at(policy, change)
        if now != change.before:
            return (
                f"{change.dotted} is {now} in the policy now, the proposal changes it from "
                f"{change.before:g}: another change was merged first"
            )
    try:
        merged = apply_changes(policy, changes)
    except PolicyError as exc:
        return f"the merged policy does not validate: {exc}"
    kv_tokens = {}
    for w in merged.workloads:
        spec = models.get(w.name)
        if spec is None:
            continue
        try:
            kv_tokens[w.name] = plan_kv_cache(merged, w, spec).max_concurrent_tokens
        except (KvPlanError, BackendError) as exc:
            return f"the merged policy's vLLM plan of {w.name} fails: {exc}"
    return Retune(merged, kv_tokens)


class TunerLoop:
    """The tuner's cycles on the replay's recorded series (module docstring); ``observe`` is
    the replay's ``replay_model.Tuning``."""

    def __init__(self, config: TunerConfig, models: Mapping[str, ModelSpec]) -> None:
        self.settings = config.settings
        self.delay_s = config.delay_s
        self.models = models
        self.state = TunerState()
        self.cycles = 0
        self.compactions = 0
        self.last_noops: tuple[NoOp, ...] = ()
        self.entries: list[_Entry] = []
        self._next_cycle = self.settings.interval_s
        self._samples: dict[str, dict[Labels, deque[tuple[float, float]]]] = {
            name: {} for name in SIGNALS
        }
        self._states: deque[LoopState] = deque()

    def observe(self, state: LoopState) -> Retune | None:
        """Record this evaluation; merge the proposals due; run a cycle when one is due."""
        earlier = self._remember(state)
        for name, samples in recorded(state, earlier).items():
            found = self._samples[name]
            for labels, value in samples:
                found.setdefault(labels, deque()).append((state.at, value))
        retune: Retune | None = None
        policy = state.policy
        for entry in self.entries:
            if entry.outcome == "in review" and entry.due_at <= state.at:
                merged = merge(policy, entry.proposal.changes, self.models)
                entry.decided_at = state.at
                if isinstance(merged, str):
                    entry.outcome, entry.refusal = "refused", merged
                else:
                    entry.outcome, retune, policy = "applied", merged, merged.policy
        if state.at >= self._next_cycle:
            while self._next_cycle <= state.at:
                self._next_cycle += self.settings.interval_s
            self._cycle(policy, self.snapshot(state.at))
        return retune

    def _remember(self, state: LoopState) -> LoopState:
        """Keep the states of the last rate window; the oldest is ``rate()``'s start."""
        window_s = duration_seconds(state.policy.metrics.rate_window)
        self._states.append(state)
        while self._states[0].at < state.at - window_s:
            self._states.popleft()
        return self._states[0]

    def snapshot(self, at: float) -> MetricsSnapshot:
        """What ``fetch_snapshot`` would read at ``at``: each series' samples in the last
        ``window`` (``name[window]``), every label set kept, combined by the tuner's rules.
        Older samples are dropped, so ``at`` never goes back."""
        start = at - self.settings.window_s
        read: dict[str, list[Series]] = {}
        for name, found in self._samples.items():
            series = []
            for labels, samples in sorted(found.items()):
                while samples and samples[0][0] <= start:
                    samples.popleft()
                if samples:
                    series.append(Series(labels, tuple(samples)))
                else:  # an instance gone for a whole window
                    del found[labels]
            read[name] = series
        return snapshot_of(at, read)

    def _cycle(self, policy: PoolPolicy, snapshot: MetricsSnapshot) -> None:
        """One tuning cycle as ``runtime.tuner.cycle.run_cycle`` runs it, without git: the
        proposal becomes a pull request in review; the same change already in review is the
        existing branch, not a new one."""
        decision = decide(
            policy=policy,
            snapshot=snapshot,
            state=self.state,
            settings=self.settings,
            models=self.models,
        )
        self.cycles += 1
        self.last_noops = decision.noops
        if decision.compaction is not None:
            self.compactions += 1
            self.state = replace(self.state, last_compaction_at=snapshot.at)
        proposal = decision.proposal
        if proposal is None:
            return
        if any(
            e.outcome == "in review" and e.proposal.changes == proposal.changes
            for e in self.entries
        ):
            return
        self.entries.append(_Entry(proposal, snapshot.at, snapshot.at + self.delay_s))
        self.state = replace(self.state, last_proposal_at=snapshot.at)

    def run(self, replay: Replay) -> TunerRun:
        """What the tuner did, each merged proposal with the replay's figures before and
        after it (``replay`` is the pooled replay this loop ran in)."""
        end = len(replay.series.t) * replay.step_s
        merges = sorted(
            e.decided_at for e in self.entries if e.outcome == "applied" and e.decided_at
        )
        bounds = [0.0, *merges, end]
        records = []
        for e in self.entries:
            before = after = None
            if e.outcome == "applied" and e.decided_at is not None:
                i = bounds.index(e.decided_at)
                before = span(replay, bounds[i - 1], e.decided_at)
                after = span(replay, e.decided_at, bounds[i + 1])
            records.append(
                ProposalRecord(
                    rule=e.proposal.rule,
                    title=e.proposal.title,
                    changes=tuple(
                        ChangeRecord(c.dotted, c.before, c.after, c.lever)
                        for c in e.proposal.changes
                    ),
                    why=e.proposal.rationale,
                    expected_effect=e.proposal.expected_effect,
                    proposed_at_s=e.proposed_at,
                    review_due_s=e.due_at,
                    outcome=e.outcome,
                    decided_at_s=e.decided_at,
                    refusal=e.refusal,
                    before=before,
                    after=after,
                )
            )
        return TunerRun(
            interval_s=self.settings.interval_s,
            review_delay_s=self.delay_s,
            cycles=self.cycles,
            proposals=tuple(records),
            compaction_requests=self.compactions,
            last_noops=tuple(f"{n.rule}: {n.reason}" for n in self.last_noops),
        )


def span(replay: Replay, start_s: float, end_s: float) -> Span | None:
    """The replay's figures over the steps in ``[start_s, end_s)`` (None: no step there)."""
    s, dt = replay.series, replay.step_s
    t = s.array("t")
    keep = (t >= start_s) & (t < end_s)
    n = int(keep.sum())
    if n == 0:
        return None
    seconds = n * dt
    return Span(
        start_s=start_s,
        end_s=end_s,
        evictions_per_minute=float(s.array("evictions")[keep].sum()) / (seconds / 60),
        prod_unmet_pod_minutes_per_hour=float(s.array("prod_pending")[keep].sum())
        * dt
        / 60
        / (seconds / 3600),
        flex_gpus_mean=float(np.mean(s.array("flex_running_gpus")[keep])),
        flex_tokens_per_s=float(s.array("flex_tokens")[keep].sum()) / seconds,
    )
