"""Flex vLLM replicas serving their request stream: a fluid model of continuous batching.

Per workload, requests are served first come, first served by the fleet of running replicas,
which a load balancer keeps evenly busy. In each step every replica has ``dt`` seconds; the
concurrent sequences per replica are ``b = clamp(outstanding / replicas, 1, slots)`` where
``slots = min(max_num_seqs, KV tokens of the vLLM plan / mean sequence length)``, and one
request costs ``prefill_s(uncached prompt) + output_tokens * decode_step_s(b, context) / b``
replica-seconds (prefill at batch 1, decode shared by the batch; the service model supplies
both, from measured data where it has them). Requests complete in order while the
cumulative cost fits the step's capacity; the remainder carries to the next step.

Prefix caching (traces with prompt block hashes, e.g. Mooncake): a request's shared leading
blocks hit when the cache still holds them: the last request that used them arrived within
the cache's retention time (free KV tokens / tokens inserted per second), and they survived
evictions (each lost replica drops its share of the fleet's cache, unless KV preservation
keeps it on the snapshot volume). Requests longer than ``max_model_len`` are rejected by
vLLM and counted as dropped. Nothing else is dropped: conservation is
``arrived == completed + outstanding + dropped``.

Every served request's hits are tallied with and without the snapshot tier; the policy's
mode picks which serves (docs/design/whatif.md, "The KV snapshot tier in one replay").

Behind an endpoint picker a fleet also admits and sheds (``request_stream.Admission``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from runtime.sim.request_stream import (
    Accepted,
    Admission,
    ClassCounts,
    Requests,
    StepLatencies,
    StepResult,
)
from runtime.sim.stream_window import QueueWindow

Array = NDArray[np.float64]

CHUNK = 4096
"""Requests costed per vector operation while a step's capacity lasts."""
BOUNDLESS = 2**62
"""Requests a backlog holds: more than any fleet serves."""


@dataclass
class Fleet:
    """One flex workload's request queue and the progress of its replicas.

    Build it with ``Fleet.admit``: requests vLLM would reject are split off at arrival.
    """

    requests: Requests
    rejected_s: Array
    """Arrival times of requests longer than ``max_model_len`` (vLLM rejects them)."""
    latencies: StepLatencies
    kv_tokens: int
    """Tokens one replica's KV cache holds (``KvCachePlan.max_concurrent_tokens``)."""
    max_num_seqs: int
    preservation: bool
    backlog_window: int = 0
    """Backlog streams: requests kept outstanding (enough to saturate the fleet)."""
    admission: Admission | None = None
    """Traffic classes behind an endpoint picker (module docstring); None: no picker."""
    rejected_class: NDArray[np.int64] | None = None
    """Traffic class of each rejected request (with ``admission``)."""
    done: int = 0
    credit: float = 0.0
    """Replica-seconds already spent on the head of the queue."""
    lost_share: float = 0.0
    """Cumulative share of the fleet's prefix cache that replica exits drop without the
    snapshot tier (survival = e^-delta); kept in both modes for the counterfactual."""
    kv_tokens_lost: float = 0.0
    _loss_times: list[float] = field(default_factory=lambda: [-math.inf])
    _loss_values: list[float] = field(default_factory=lambda: [0.0])
    """``lost_share`` after each replica exit, in time order (from 0 before the first)."""
    _retention_s: float = math.inf
    _in_flight: float = 0.0
    waiting: float = 0.0
    """Requests queued beyond the running batch after the last step (what each vLLM's
    ``num_requests_waiting`` adds up to over the fleet)."""
    kv_usage: float = 0.0
    """Share of a replica's KV tokens the running batch held over the last step, on average
    (vLLM's ``kv_cache_usage_perc``: unreferenced prefix-cache blocks count as free)."""
    _mean_context: float = 0.0
    _batch: float = 1.0
    """Sequences per replica in the last step (the drain window's decode speed)."""
    _issued: int = 0
    _cold_prefill: Array = field(init=False)
    """Backlog streams: prefill seconds of each request of the cycle without cache hits,
    computed once (costing them again every step dominated the replay)."""
    _sums: tuple[Array, ...] | None = field(init=False)
    """Backlog streams without prefix data: running sums (``stream_window.SUMS``) over one
    cycle, so a step's completions are found by bisection, not by costing every request."""
    _queue: QueueWindow = field(init=False)
    """Other streams: the same, and the shed marks, for the requests not yet completed."""

    # With ``admission`` only (``_admission_state``):
    step_shed: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class shed in the last step."""
    shed: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class shed so far."""
    lost: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class aborted at a replica exit (in flight beyond the drain window)."""
    drained: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class that an exiting replica finished within its drain window."""
    _arrived: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class the picker has answered (admitted or shed)."""
    _finished: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    """Requests of each class before ``done`` that were not shed."""
    _pending: StepResult | None = field(init=False, repr=False, compare=False)
    """Completions of the last drains, reported with the next step."""

    def __post_init__(self) -> None:
        r = self.requests
        by_sums = not r.prefix_tokens.any()
        screened = self.admission is not None and not r.backlog
        self._queue = QueueWindow(r, self.latencies, by_sums=by_sums, screened=screened)
        self._cold_prefill, self._sums = np.empty(0), None
        if r.backlog:
            self._cold_prefill = np.asarray(
                self.latencies.prefill_s(r.input_tokens.astype(np.float64)), dtype=np.float64
            )
            columns = (
                self._cold_prefill,
                r.output_tokens.astype(np.float64),
                r.input_tokens.astype(np.float64),
                np.where(r.hashed, r.input_tokens, 0).astype(np.float64),
            )
            if by_sums:
                self._sums = tuple(np.concatenate([[0.0], np.cumsum(c)]) for c in columns)
        if self.admission is not None:
            self._admission_state()

    def _admission_state(self) -> None:
        """The per-class counters; the shed marks live in ``_queue``, filled as requests
        arrive (a shed request is always a new arrival, so the sums before it stay final)."""
        assert self.admission is not None
        k = self.admission.classes
        given = self.requests.traffic_class
        if given is not None and given.size and not (given.min() >= 0 and given.max() < k):
            raise ValueError(f"traffic class indices must lie in [0, {k})")
        if self.rejected_class is None:
            self.rejected_class = np.zeros(self.rejected_s.size, dtype=np.int64)
        self.step_shed = np.zeros(k, dtype=np.int64)
        self.shed = np.zeros(k, dtype=np.int64)
        self.lost = np.zeros(k, dtype=np.int64)
        self.drained = np.zeros(k, dtype=np.int64)
        self._arrived = np.zeros(k, dtype=np.int64)
        self._finished = np.zeros(k, dtype=np.int64)
        self._pending = None

    @classmethod
    def admit(
        cls,
        requests: Requests | Accepted,
        *,
        max_model_len: int,
        latencies: StepLatencies,
        kv_tokens: int,
        max_num_seqs: int,
        preservation: bool,
        backlog_window: int = 0,
        admission: Admission | None = None,
    ) -> Fleet:
        """The fleet of ``requests``, split by ``max_model_len`` here unless already split."""
        if isinstance(requests, Requests):
            requests = Accepted.split(requests, max_model_len)
        elif requests.max_model_len != max_model_len:
            raise ValueError(
                f"requests split at max_model_len {requests.max_model_len}, not {max_model_len}"
            )
        return cls(
            requests.requests,
            requests.rejected_s,
            latencies,
            kv_tokens,
            max_num_seqs,
            preservation,
            backlog_window,
            admission,
            requests.rejected_class,
        )

    def arrived(self, until: float) -> int:
        """Requests that arrived by ``until`` (a backlog issues what keeps it saturated)."""
        if self.requests.backlog:
            self._issued = max(self._issued, self.done + self.backlog_window)
            return self._issued
        return int(np.searchsorted(self.requests.arrival_s, until, side="right"))

    def rejected(self, until: float) -> int:
        return int(np.searchsorted(self.rejected_s, until, side="right"))

    def _index(self, start: int, stop: int) -> NDArray[np.int64]:
        idx = np.arange(start, stop, dtype=np.int64)
        return idx % len(self.requests) if self.requests.backlog else idx

    def _live(self, start: int, stop: int) -> int:
        """Requests in ``[start, stop)`` that were not shed."""
        return stop - start if self.requests.backlog else self._queue.live(start, stop)

    def _classes(self, indices: NDArray[np.int64]) -> NDArray[np.int64]:
        given = self.requests.traffic_class
        return np.zeros(indices.size, dtype=np.int64) if given is None else given[indices]

    def _arrive(self, upto: int, saturated: bool) -> None:
        """The requests arriving up to index ``upto`` join the queue; behind a picker, while
        the pool is ``saturated`` the sheddable ones are shed, everything else is queued."""
        start = self._queue.end
        if self.admission is None:
            self._queue.extend(upto)
            return
        self.step_shed = np.zeros(self.admission.classes, dtype=np.int64)
        if upto <= start:
            return
        classes = self._classes(np.arange(start, upto, dtype=np.int64))
        if saturated:
            mask = self.admission.sheddable[classes]
        else:
            mask = np.zeros(upto - start, dtype=bool)
        self._queue.extend(upto, mask)
        self.step_shed = np.bincount(classes[mask], minlength=self.admission.classes)
        self.shed += self.step_shed
        self._arrived += np.bincount(classes, minlength=self.admission.classes)

    def _complete(self, upto: int) -> None:
        """The queue's head moves to ``upto``: what lies before it is forgotten."""
        if not self.requests.backlog:
            if self.admission is not None:
                done = np.arange(self.done, upto, dtype=np.int64)
                live = ~self._queue.shed_between(self.done, upto)
                self._finished += np.bincount(
                    self._classes(done[live]), minlength=self.admission.classes
                )
            self._queue.drop_before(upto)
        self.done = upto

    def serve(
        self, now: float, dt: float, replicas: float, *, saturated: bool = False
    ) -> StepResult:
        """Serve for ``dt`` seconds from ``now`` with ``replicas`` running replicas (replica
        equivalents: production lends a fraction of its GPUs). ``saturated``: the endpoint
        picker found the fleet's pool saturated at the step's start (only with admission)."""
        backlog = self.requests.backlog
        if not backlog:
            self._arrive(self.arrived(now + dt), saturated)
        # A backlog never runs dry: the fleet takes as much as its capacity allows.
        arrived = BOUNDLESS if backlog else self.arrived(now + dt)
        result = self._serve(now, dt, replicas, arrived)
        if self.admission is not None and self._pending is not None:
            result.add(self._pending)
            self._pending = None
        return result

    def _serve(self, now: float, dt: float, replicas: float, arrived: int) -> StepResult:
        """One step of the fluid model on the requests up to index ``arrived``."""
        if replicas <= 0 or self._live(self.done, arrived) <= 0:
            self._in_flight = self.waiting = self.kv_usage = 0.0
            if self.admission is not None and replicas <= 0:
                # Nothing runs, so all that was admitted waits: what the picker reads.
                self.waiting = float(self._live(self.done, self.arrived(now + dt)))
            return StepResult(busy=0.0)
        r = self.requests
        head = self._index(self.done, min(arrived, self.done + CHUNK))
        if self.admission is not None and not r.backlog:
            live = head[~self._queue.shed(head)]
            head = live if live.size else head
        full = r.input_tokens[head] + r.output_tokens[head]
        mean_len = float(full.mean())
        slots = max(1, min(self.max_num_seqs, int(self.kv_tokens // max(mean_len, 1.0))))
        batch = min(max(self._live(self.done, arrived) / replicas, 1.0), float(slots))
        context = float((r.input_tokens[head] + r.output_tokens[head] / 2).mean())
        per_token = float(self.latencies.decode_step_s(batch, context)) / batch
        capacity = replicas * dt
        budget = self.credit + capacity
        result = StepResult(busy=0.0)
        if self._queue.by_sums:
            start, spent = self._take_by_sums(arrived, budget, per_token, result)
        else:
            start, spent = self._take_by_chunks(arrived, budget, per_token, now, result)
        self._complete(start)
        if r.backlog:
            self._issued = max(self._issued, self.done + self.backlog_window)
        if self.done >= arrived:
            used = spent - self.credit
            self.credit = 0.0
        else:
            used = capacity
            self.credit = budget - spent
        result.busy = min(1.0, max(used, 0.0) / capacity)
        # The batch's blocks for the share of the step the replicas served: the mean a scrape
        # of vLLM's gauge sees.
        self.kv_usage = min(1.0, result.busy * batch * mean_len / max(self.kv_tokens, 1))
        self._in_flight = min(float(self._live(self.done, arrived)), replicas * batch)
        self.waiting = max(0.0, self._live(self.done, self.arrived(now + dt)) - self._in_flight)
        self._mean_context = context
        self._batch = batch
        free_tokens = max(0.0, replicas * (self.kv_tokens - batch * mean_len))
        inserted = (result.prompt_tokens - result.hit_tokens) / dt
        self._retention_s = free_tokens / inserted if inserted > 0 else math.inf
        return result

    def _take_by_chunks(
        self, arrived: int, budget: float, per_token: float, now: float, result: StepResult
    ) -> tuple[int, float]:
        """Complete requests in order while their cost (with cache hits) fits ``budget``;
        shed requests cost nothing and count for nothing."""
        r = self.requests
        screened = self.admission is not None and not r.backlog
        spent = 0.0
        start = self.done
        while start < arrived:
            idx = self._index(start, min(arrived, start + CHUNK))
            kept, survived = self._hits(idx, now)
            hits = kept if self.preservation else survived
            cost = self._cold_prefill[idx] if r.backlog else self._queue.cold(idx)
            warm = hits > 0
            if warm.any():
                cost = cost.copy()
                cost[warm] = self.latencies.prefill_s(r.input_tokens[idx][warm] - hits[warm])
            unit = cost + r.output_tokens[idx] * per_token
            if screened:
                unit = np.where(self._queue.shed(idx), 0.0, unit)
            total = np.cumsum(unit) + spent
            n = int(np.searchsorted(total, budget, side="right"))
            if n:
                served = idx[:n]
                if screened:
                    live = ~self._queue.shed(served)
                    served, kept_n, survived_n, hits_n = (
                        served[live],
                        kept[:n][live],
                        survived[:n][live],
                        hits[:n][live],
                    )
                else:
                    kept_n, survived_n, hits_n = kept[:n], survived[:n], hits[:n]
                result.completed += int(served.size)
                result.output_tokens += int(r.output_tokens[served].sum())
                result.prompt_tokens += int(r.input_tokens[served].sum())
                hashed = r.hashed[served]
                result.hit_tokens += float(hits_n[hashed].sum())
                result.hit_tokens_with_tier += float(kept_n[hashed].sum())
                result.hit_tokens_without_tier += float(survived_n[hashed].sum())
                result.query_tokens += int(r.input_tokens[served][hashed].sum())
                spent = float(total[n - 1])
            start += n
            if n < idx.size:
                break
        return start, spent

    def _take_by_sums(
        self, arrived: int, budget: float, per_token: float, result: StepResult
    ) -> tuple[int, float]:
        """``_take_by_chunks`` for streams that never hit the cache, by bisection on sums
        (less the sums of the shed requests, which cost nothing)."""
        sums, n = self._sums, len(self.requests)

        def at(i: int) -> tuple[float, ...]:
            if sums is None:
                return self._queue.sums_at(i)
            cycles, rest = divmod(i, n)
            return tuple(cycles * float(c[-1]) + float(c[rest]) for c in sums)

        base = at(self.done)

        def cost(m: int) -> float:
            prefill, output, *_ = at(self.done + m)
            return (prefill - base[0]) + per_token * (output - base[1])

        limit = arrived - self.done
        if cost(limit) <= budget:
            m = limit
        else:
            low, probe = 0, 1
            while probe < limit and cost(probe) <= budget:
                low, probe = probe, probe * 2
            high = min(probe, limit)
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if cost(mid) <= budget else (low, mid)
            m = low
        end = at(self.done + m)
        result.completed += self._live(self.done, self.done + m)
        result.output_tokens += round(end[1] - base[1])
        result.prompt_tokens += round(end[2] - base[2])
        result.query_tokens += round(end[3] - base[3])
        return self.done + m, cost(m)

    def _hits(self, idx: NDArray[np.int64], now: float) -> tuple[Array, Array]:
        """Hit tokens of requests ``idx`` served at ``now``: with the snapshot tier (every
        fresh prefix) and without it (the share that survived the exits since it was seen)."""
        r = self.requests
        prefix = r.prefix_tokens[idx].astype(np.float64)
        if not prefix.any():
            return prefix, prefix
        seen = np.nan_to_num(r.prefix_last_seen[idx], nan=-math.inf)
        kept = np.where((prefix > 0) & ((now - seen) <= self._retention_s), prefix, 0.0)
        # lost_share just before ``seen``: an exit at ``seen`` itself still drops the blocks,
        # as the request that arrived then was served in an earlier step.
        before = np.searchsorted(self._loss_times, seen, side="left") - 1
        lost_then = np.asarray(self._loss_values)[np.maximum(before, 0)]
        return kept, kept * np.exp(lost_then - self.lost_share)

    def lose_replicas(self, lost: int, before: int, now: float) -> float:
        """``lost`` of ``before`` replicas exited: their in-flight work and cache share go.

        Returns the KV tokens lost (the context of in-flight sequences, to be recomputed).
        With KV preservation the prefix cache survives on the snapshot volume; the loss is
        recorded either way, for the hits without the tier (``_hits``). With admission the
        exiting replicas' in-flight requests are drained or lost (``_drain``) instead of
        being served again by the rest of the fleet.
        """
        if lost <= 0 or before <= 0:
            return 0.0
        share = min(1.0, lost / before)
        tokens = self._in_flight * share * self._mean_context
        self.credit *= 1 - share
        self.kv_tokens_lost += tokens
        self.lost_share += share
        self._loss_times.append(now)
        self._loss_values.append(self.lost_share)
        if self.admission is not None:
            self._drain(round(self._in_flight * share))
        return tokens

    def _drain(self, count: int) -> None:
        """The ``count`` requests in flight on exiting replicas (the fluid model's head of the
        queue) leave it: each finishes within the drain window with probability
        ``min(1, window / T)``, where ``T`` is its time alone in the batch (prefill plus its
        output at the last step's decode speed) and its progress is uniform over ``T``; the
        rest are aborted when the window closes (lost)."""
        assert self.admission is not None
        if count <= 0:
            return
        r = self.requests
        if r.backlog:
            idx = self._index(self.done, self.done + count)
            stop = self.done + count
        else:
            live = np.flatnonzero(~self._queue.shed_between(self.done, self._queue.end))
            idx = live[:count].astype(np.int64) + self.done
            if not idx.size:
                return
            stop = int(idx[-1]) + 1
        step_s = float(self.latencies.decode_step_s(self._batch, self._mean_context))
        cold = self._cold_prefill[idx] if r.backlog else self._queue.cold(idx)
        alone_s = cold + r.output_tokens[idx] * step_s
        finish = np.minimum(1.0, self.admission.drain_window_s / np.maximum(alone_s, 1e-9))
        k = self.admission.classes
        classes = self._classes(idx)
        drained = np.rint(np.bincount(classes, weights=finish, minlength=k)).astype(np.int64)
        in_flight = np.bincount(classes, minlength=k)
        self.drained += drained
        self.lost += in_flight - drained
        pending = self._pending or StepResult(busy=0.0)
        pending.completed += int(drained.sum())
        pending.output_tokens += round(float((finish * r.output_tokens[idx]).sum()))
        pending.prompt_tokens += round(float((finish * r.input_tokens[idx]).sum()))
        self._pending = pending
        self._complete(stop)
        self._in_flight = max(0.0, self._in_flight - idx.size)

    def class_counts(self, end: float) -> ClassCounts:
        """Requests per traffic class at ``end`` (with admission; see ``ClassCounts``)."""
        assert self.admission is not None
        k = self.admission.classes
        rejected_class = self.rejected_class
        assert rejected_class is not None
        dropped = np.bincount(rejected_class[: self.rejected(end)], minlength=k)
        if self.requests.backlog:
            one = self._classes(np.zeros(1, dtype=np.int64))
            issued = self.arrived(end)
            arrived = np.bincount(one, minlength=k) * issued
            finished = np.bincount(one, minlength=k) * self.done
            queued = np.bincount(one, minlength=k) * (issued - self.done)
        else:
            upto = self.arrived(end)
            if upto != self._queue.end:
                raise ValueError("class_counts before every arrival was admitted")
            arrived, finished = self._arrived.copy(), self._finished.copy()
            tail = np.arange(self.done, upto, dtype=np.int64)
            live = ~self._queue.shed_between(self.done, upto)
            queued = np.bincount(self._classes(tail[live]), minlength=k)
        return ClassCounts(
            arrived=arrived + dropped,
            served=finished - self.lost,
            queued=queued,
            shed=self.shed.copy(),
            dropped=dropped,
            lost=self.lost.copy(),
            drained=self.drained.copy(),
        )
