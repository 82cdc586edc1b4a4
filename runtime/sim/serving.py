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

What the snapshot tier buys is counted in the same replay: every served request's hits are
tallied both with the tier (the cache survives evictions) and without it (the lost share
goes), and the policy's mode decides which of the two the replay serves with. A second replay
with the flag flipped would not answer the question: its extra (or missing) prefill time
moves the closed loop (duty, budget, HPA), so its evictions fall elsewhere and no eviction of
one run has a counterpart in the other. The tally is exact for the served schedule: the same
requests, at the same times, with the same retention, under the other loss history; it does
not follow the schedule change the other mode's prefill time would cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

CHUNK = 4096
"""Requests costed per vector operation while a step's capacity lasts."""
BOUNDLESS = 2**62
"""Requests a backlog holds: more than any fleet serves."""


class StepLatencies(Protocol):
    """What serving needs from a service model (``runtime.sim.service_time``)."""

    def prefill_s(self, tokens: Array | float) -> Array: ...

    def decode_step_s(self, batch: Array | float, context: Array | float) -> Array: ...


@dataclass(frozen=True)
class Requests:
    """An arrival-ordered request stream; a ``backlog`` stream is always available (cycled)."""

    arrival_s: Array
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    prefix_tokens: NDArray[np.int64]
    """Leading prompt tokens shared with an earlier request (0 where unknown or none)."""
    prefix_last_seen: Array
    """Arrival of the latest earlier request sharing them (nan where none)."""
    hashed: NDArray[np.bool_]
    """Whether the request's trace carries block hashes (its prefix hits are known)."""
    backlog: bool = False

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def select(self, keep: NDArray[np.bool_]) -> Requests:
        return Requests(
            self.arrival_s[keep],
            self.input_tokens[keep],
            self.output_tokens[keep],
            self.prefix_tokens[keep],
            self.prefix_last_seen[keep],
            self.hashed[keep],
            self.backlog,
        )

    @staticmethod
    def merge(streams: list[Requests]) -> Requests:
        """One stream in arrival order (stable, so equal times keep their trace order)."""
        if any(s.backlog for s in streams) and len(streams) > 1:
            raise ValueError("a backlog stream cannot be merged with other streams")
        cat = {
            name: np.concatenate([getattr(s, name) for s in streams])
            for name in (
                "arrival_s",
                "input_tokens",
                "output_tokens",
                "prefix_tokens",
                "prefix_last_seen",
                "hashed",
            )
        }
        order = np.argsort(cat["arrival_s"], kind="stable")
        return Requests(**{k: v[order] for k, v in cat.items()}, backlog=streams[0].backlog)


@dataclass
class StepResult:
    busy: float
    """Share of the fleet's replica-seconds spent serving (the replicas' duty cycle)."""
    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    hit_tokens: float = 0.0
    """Prefix hits as served (with the tier when the fleet preserves its KV, else without)."""
    hit_tokens_with_tier: float = 0.0
    hit_tokens_without_tier: float = 0.0
    query_tokens: int = 0


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
    _issued: int = 0
    _cold_prefill: Array = field(init=False)
    """Prefill seconds of each request without cache hits, computed once: most requests of
    most streams hit nothing, and costing them again every step dominated the replay."""

    _sums: tuple[Array, ...] | None = field(init=False)
    """Streams without prefix data: running sums of (cold prefill, output, prompt, queried
    prompt) per request, so a step's completions are found by bisection, not by costing every
    request it serves."""

    def __post_init__(self) -> None:
        r = self.requests
        self._cold_prefill = np.asarray(
            self.latencies.prefill_s(r.input_tokens.astype(np.float64)), dtype=np.float64
        )
        self._sums = None
        if not r.prefix_tokens.any():
            columns = (
                self._cold_prefill,
                r.output_tokens.astype(np.float64),
                r.input_tokens.astype(np.float64),
                np.where(r.hashed, r.input_tokens, 0).astype(np.float64),
            )
            self._sums = tuple(np.concatenate([[0.0], np.cumsum(c)]) for c in columns)

    @classmethod
    def admit(
        cls,
        requests: Requests,
        *,
        max_model_len: int,
        latencies: StepLatencies,
        kv_tokens: int,
        max_num_seqs: int,
        preservation: bool,
        backlog_window: int = 0,
    ) -> Fleet:
        fits = (requests.input_tokens + requests.output_tokens) <= max_model_len
        if requests.backlog and not fits.any():
            raise ValueError(
                f"no backlog request fits max_model_len {max_model_len}: nothing could be served"
            )
        return cls(
            requests.select(fits),
            requests.arrival_s[~fits] if not requests.backlog else np.empty(0),
            latencies,
            kv_tokens,
            max_num_seqs,
            preservation,
            backlog_window,
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

    def serve(self, now: float, dt: float, replicas: int) -> StepResult:
        """Serve for ``dt`` seconds from ``now`` with ``replicas`` running replicas."""
        # A backlog never runs dry: the fleet takes as much as its capacity allows.
        arrived = BOUNDLESS if self.requests.backlog else self.arrived(now + dt)
        if replicas <= 0 or arrived <= self.done:
            self._in_flight = self.waiting = self.kv_usage = 0.0
            return StepResult(busy=0.0)
        r = self.requests
        head = self._index(self.done, min(arrived, self.done + CHUNK))
        full = r.input_tokens[head] + r.output_tokens[head]
        mean_len = float(full.mean())
        slots = max(1, min(self.max_num_seqs, int(self.kv_tokens // max(mean_len, 1.0))))
        batch = min(max((arrived - self.done) / replicas, 1.0), float(slots))
        context = float((r.input_tokens[head] + r.output_tokens[head] / 2).mean())
        per_token = float(self.latencies.decode_step_s(batch, context)) / batch
        capacity = replicas * dt
        budget = self.credit + capacity
        result = StepResult(busy=0.0)
        if self._sums is not None:
            start, spent = self._take_by_sums(arrived, budget, per_token, result)
        else:
            start, spent = self._take_by_chunks(arrived, budget, per_token, now, result)
        self.done = start
        if self.requests.backlog:
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
        self._in_flight = min(float(arrived - self.done), replicas * batch)
        self.waiting = max(0.0, self.arrived(now + dt) - self.done - self._in_flight)
        self._mean_context = context
        free_tokens = max(0.0, replicas * (self.kv_tokens - batch * mean_len))
        inserted = (result.prompt_tokens - result.hit_tokens) / dt
        self._retention_s = free_tokens / inserted if inserted > 0 else math.inf
        return result

    def _take_by_chunks(
        self, arrived: int, budget: float, per_token: float, now: float, result: StepResult
    ) -> tuple[int, float]:
        """Complete requests in order while their cost (with cache hits) fits ``budget``."""
        r = self.requests
        spent = 0.0
        start = self.done
        while start < arrived:
            idx = self._index(start, min(arrived, start + CHUNK))
            kept, survived = self._hits(idx, now)
            hits = kept if self.preservation else survived
            cost = self._cold_prefill[idx]
            warm = hits > 0
            if warm.any():
                cost = cost.copy()
                cost[warm] = self.latencies.prefill_s(r.input_tokens[idx][warm] - hits[warm])
            total = np.cumsum(cost + r.output_tokens[idx] * per_token) + spent
            n = int(np.searchsorted(total, budget, side="right"))
            if n:
                served = idx[:n]
                result.completed += n
                result.output_tokens += int(r.output_tokens[served].sum())
                result.prompt_tokens += int(r.input_tokens[served].sum())
                hashed = r.hashed[served]
                result.hit_tokens += float(hits[:n][hashed].sum())
                result.hit_tokens_with_tier += float(kept[:n][hashed].sum())
                result.hit_tokens_without_tier += float(survived[:n][hashed].sum())
                result.query_tokens += int(r.input_tokens[served][hashed].sum())
                spent = float(total[n - 1])
            start += n
            if n < idx.size:
                break
        return start, spent

    def _take_by_sums(
        self, arrived: int, budget: float, per_token: float, result: StepResult
    ) -> tuple[int, float]:
        """``_take_by_chunks`` for streams that never hit the cache, by bisection on sums."""
        assert self._sums is not None
        sums, n = self._sums, len(self.requests)

        def at(i: int) -> tuple[float, ...]:
            if not self.requests.backlog:
                return tuple(float(c[i]) for c in sums)
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
        result.completed += m
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
        recorded either way, for the hits without the tier (``_hits``).
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
        return tokens
