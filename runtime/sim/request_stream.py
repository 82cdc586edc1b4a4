"""What the serving model reads and reports: the request stream (arrival order, tokens,
prefixes, traffic classes), the service model's latencies it asks for, the admission rules
of an endpoint picker, and the counts of a step and of a replay's classes
(``runtime.sim.serving`` serves them).

Behind an endpoint picker (a policy with a ``serving`` section, ``runtime.sim.classes``) a
fleet also admits: every request belongs to a traffic class, and a sheddable one that arrives
in a step whose pool the saturation detector finds saturated is shed (marked, never served,
costing nothing) instead of queued. A backlog is never shed: its client always has more work
and resubmits what is refused as soon as there is room, so at this model's grain it keeps the
fleet as busy as before and its refused attempts are retries, not requests. The requests in
flight on a replica that exits are drained or lost as the pod's shutdown sequence allows
(``Admission.drain_window_s``), no longer served again. Conservation is then, per class,
``arrived == served + queued + shed + dropped + lost``. Without an
``Admission`` none of this runs and the fleet behaves exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from runtime.sim.counts import TokenCounts

Array = NDArray[np.float64]


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
    traffic_class: NDArray[np.int64] | None = None
    """Index of each request's traffic class in the replay's classes (``runtime.sim.classes``);
    None: the stream has no class (a policy without a ``serving`` section)."""

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def select(self, keep: NDArray[np.bool_]) -> Requests:
        """The requests where ``keep`` holds (this stream itself where it holds for all)."""
        if keep.all():
            return self
        return Requests(
            self.arrival_s[keep],
            self.input_tokens[keep],
            self.output_tokens[keep],
            self.prefix_tokens[keep],
            self.prefix_last_seen[keep],
            self.hashed[keep],
            self.backlog,
            None if self.traffic_class is None else self.traffic_class[keep],
        )

    @staticmethod
    def merge(streams: list[Requests]) -> Requests:
        """One stream in arrival order (stable, so equal times keep their trace order)."""
        if any(s.backlog for s in streams) and len(streams) > 1:
            raise ValueError("a backlog stream cannot be merged with other streams")
        if len(streams) == 1 and not (np.diff(streams[0].arrival_s) < 0).any():
            return streams[0]  # already in order: the stable sort would only copy it
        classed = {s.traffic_class is not None for s in streams}
        if len(classed) > 1:
            raise ValueError("streams with and without traffic classes cannot be merged")
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
        if classed == {True}:
            cat["traffic_class"] = np.concatenate([s.traffic_class for s in streams])
        order = np.argsort(cat["arrival_s"], kind="stable")
        return Requests(**{k: v[order] for k, v in cat.items()}, backlog=streams[0].backlog)


@dataclass(frozen=True)
class Accepted:
    """A stream as vLLM's length limit splits it at arrival: the requests it serves and the
    arrival times (and classes) of those longer than ``max_model_len``, which it rejects.
    Split once where the stream is built, the whole stream need not outlive the split."""

    requests: Requests
    max_model_len: int
    rejected_s: Array
    rejected_class: NDArray[np.int64] | None
    """Traffic class of each rejected request (None: the stream has no classes)."""

    @classmethod
    def split(cls, requests: Requests, max_model_len: int) -> Accepted:
        fits = (requests.input_tokens + requests.output_tokens) <= max_model_len
        if requests.backlog and not fits.any():
            raise ValueError(
                f"no backlog request fits max_model_len {max_model_len}: nothing could be served"
            )
        given = None if requests.backlog else requests.traffic_class
        return cls(
            requests.select(fits),
            max_model_len,
            requests.arrival_s[~fits] if not requests.backlog else np.empty(0),
            None if given is None else given[~fits],
        )


@dataclass(kw_only=True)
class StepResult(TokenCounts):
    """One step of a fleet: its counts and how busy it was."""

    busy: float
    """Share of the fleet's replica-seconds spent serving (the replicas' duty cycle)."""


@dataclass(frozen=True)
class Admission:
    """How a fleet behind an endpoint picker admits requests and loses them at replica exits
    (``runtime.sim.classes`` builds it from the policy)."""

    sheddable: NDArray[np.bool_]
    """Per traffic-class index: whether the picker sheds it when the pool is saturated."""
    drain_window_s: float
    """Seconds a request in flight on an exiting replica has to finish: the preStop sleep
    (the pod still serves while endpoints drop it) plus vLLM's drain after SIGTERM
    (``disruption.prestop_delay_s + drain_s``). What needs longer is aborted (lost)."""

    @property
    def classes(self) -> int:
        """Number of traffic classes (the length of every per-class array)."""
        return int(self.sheddable.size)


@dataclass(frozen=True)
class ClassCounts:
    """One fleet's requests per traffic class at the end of a replay (arrays by class index);
    ``arrived == served + queued + shed + dropped + lost`` class by class."""

    arrived: NDArray[np.int64]
    served: NDArray[np.int64]
    """Completed, by the running fleet or drained by an exiting replica."""
    queued: NDArray[np.int64]
    shed: NDArray[np.int64]
    dropped: NDArray[np.int64]
    """Longer than ``max_model_len`` (vLLM rejects them)."""
    lost: NDArray[np.int64]
    """In flight on an exiting replica and not finished within its drain window."""
    drained: NDArray[np.int64]
    """In flight on an exiting replica and finished within it (part of ``served``)."""
