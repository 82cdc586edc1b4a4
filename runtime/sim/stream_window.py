"""Columns of per-request state held for a window of a request stream, not for all of it.

A fleet (``runtime.sim.serving``) only ever reads the requests from the oldest one not yet
completed to the last arrival: first come, first served makes them one index range. What it
derives from its stream (cold prefill seconds, shed marks, running sums) is kept for that
range alone, so its memory follows the queue and one step's arrivals, not the length of the
replay. Running sums carry their total across the window's start: each new total is the
previous one plus the next value, as a whole-stream ``np.cumsum`` adds them, so the values
are the same floats.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import DTypeLike, NDArray

from runtime.sim.request_stream import Requests, StepLatencies

Array = NDArray[np.float64]

MIN_CAPACITY = 4096
"""Rows a window allocates at least (a step's arrivals usually fit at once)."""


class StreamWindow:
    """Per-request columns over the absolute request indices ``[lo, hi)`` and running-total
    columns over the boundaries ``[lo, hi]`` (the total of the requests before each index).

    ``extend`` appends the next requests, ``drop_before`` forgets the oldest ones; storage
    grows by doubling and is compacted when the dropped rows would otherwise be copied.
    """

    def __init__(self, items: Mapping[str, DTypeLike], totals: Mapping[str, DTypeLike]) -> None:
        self.lo = 0
        self.hi = 0
        self._offset = 0
        """Buffer row of index ``lo``."""
        self._capacity = MIN_CAPACITY
        self._items = {name: np.empty(MIN_CAPACITY, dtype=t) for name, t in items.items()}
        self._totals = {name: np.zeros(MIN_CAPACITY + 1, dtype=t) for name, t in totals.items()}

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def extend(
        self, items: Mapping[str, NDArray[np.generic]], totals: Mapping[str, NDArray[np.generic]]
    ) -> None:
        """Append requests ``hi ..`` : their values per item column and, per total column, the
        totals after each of them (the caller adds them to ``total(name, hi)``)."""
        count = len(next(iter(items.values()))) if items else len(next(iter(totals.values())))
        if count == 0:
            return
        self._reserve(count)
        start = self._offset + self.size
        for name, values in items.items():
            self._items[name][start : start + count] = values
        for name, values in totals.items():
            self._totals[name][start + 1 : start + 1 + count] = values
        self.hi += count

    def drop_before(self, index: int) -> None:
        """Forget the requests before ``index`` (``lo <= index <= hi``)."""
        if not self.lo <= index <= self.hi:
            raise IndexError(f"drop_before({index}) outside the window [{self.lo}, {self.hi}]")
        self._offset += index - self.lo
        self.lo = index

    def items(self, name: str, start: int, stop: int) -> NDArray[np.generic]:
        """The values of requests ``[start, stop)`` (a view)."""
        self._check(start, stop)
        base = self._offset - self.lo
        return self._items[name][base + start : base + stop]

    def take(self, name: str, indices: NDArray[np.int64]) -> NDArray[np.generic]:
        """The values of the requests at ``indices`` (all inside the window)."""
        if indices.size:
            self._check(int(indices.min()), int(indices.max()) + 1)
        return self._items[name][indices + (self._offset - self.lo)]

    def total(self, name: str, index: int) -> float:
        """The running total before request ``index`` (``lo <= index <= hi``)."""
        self._check(index, index)
        return float(self._totals[name][self._offset + index - self.lo])

    def _check(self, start: int, stop: int) -> None:
        if not self.lo <= start <= stop <= self.hi:
            window = f"[{self.lo}, {self.hi})"
            raise IndexError(f"requests [{start}, {stop}) outside the window {window}")

    def _reserve(self, count: int) -> None:
        """Room for ``count`` more rows after ``hi``: the live rows move to the front, into
        buffers twice their need when the current ones are more than half full."""
        need = self.size + count
        if self._offset + need <= self._capacity:
            return
        rows = max(MIN_CAPACITY, 2 * need) if 2 * need > self._capacity else self._capacity
        live = slice(self._offset, self._offset + self.size)
        bounds = slice(self._offset, self._offset + self.size + 1)
        for columns, extra, span in ((self._items, 0, live), (self._totals, 1, bounds)):
            for name, old in columns.items():
                new = np.empty(rows + extra, dtype=old.dtype)
                new[: span.stop - span.start] = old[span]
                columns[name] = new
        self._offset = 0
        self._capacity = rows


SUMS = ("prefill", "output", "prompt", "queried")
"""Running sums a stream without prefix data is served by: cold prefill seconds, output
tokens, prompt tokens and prompt tokens of hashed requests (whose hits are known)."""


class QueueWindow:
    """What a fleet derives from a stream it serves in arrival order, for the requests from
    the oldest one not yet completed to the last arrival: each request's prefill seconds
    without cache hits, and optionally the running sums that find a step's completions by
    bisection and the endpoint picker's shed marks (a shed request costs and counts nothing,
    so the sums net of the shed ones are what the fleet serves)."""

    def __init__(
        self, requests: Requests, latencies: StepLatencies, *, by_sums: bool, screened: bool
    ) -> None:
        self.requests = requests
        self.latencies = latencies
        self.by_sums = by_sums
        self.screened = screened
        items: dict[str, DTypeLike] = {"cold": np.float64}
        totals: dict[str, DTypeLike] = {}
        if by_sums:
            totals |= dict.fromkeys(SUMS, np.float64)
        if screened:
            items["shed"] = np.bool_
            totals["shed_count"] = np.int64
            if by_sums:
                totals |= dict.fromkeys((f"shed_{n}" for n in SUMS), np.float64)
        self.columns = StreamWindow(items, totals)

    @property
    def end(self) -> int:
        """One past the last request derived (the arrivals so far)."""
        return self.columns.hi

    def extend(self, upto: int, shed: NDArray[np.bool_] | None = None) -> None:
        """Derive requests ``[end, upto)``; ``shed`` marks those shed at arrival (screened
        windows only, one mark a request)."""
        w, start = self.columns, self.columns.hi
        if upto <= start:
            return
        r, seg = self.requests, slice(start, upto)
        cold = np.asarray(
            self.latencies.prefill_s(r.input_tokens[seg].astype(np.float64)), dtype=np.float64
        )
        items: dict[str, NDArray[np.generic]] = {"cold": cold}
        totals: dict[str, NDArray[np.generic]] = {}
        values = (
            cold,
            r.output_tokens[seg].astype(np.float64),
            r.input_tokens[seg].astype(np.float64),
            np.where(r.hashed[seg], r.input_tokens[seg], 0).astype(np.float64),
        )
        if self.by_sums:
            for name, column in zip(SUMS, values, strict=True):
                totals[name] = np.cumsum(np.concatenate(([w.total(name, start)], column)))[1:]
        if self.screened:
            assert shed is not None and shed.size == upto - start
            items["shed"] = shed
            totals["shed_count"] = int(w.total("shed_count", start)) + np.cumsum(shed)
            if self.by_sums:
                for name, column in zip(SUMS, values, strict=True):
                    shed_sum = np.cumsum(np.where(shed, column, 0.0))
                    totals[f"shed_{name}"] = w.total(f"shed_{name}", start) + shed_sum
        w.extend(items, totals)

    def drop_before(self, index: int) -> None:
        self.columns.drop_before(index)

    def cold(self, indices: NDArray[np.int64]) -> Array:
        return self.columns.take("cold", indices)  # type: ignore[return-value]

    def shed(self, indices: NDArray[np.int64]) -> NDArray[np.bool_]:
        return self.columns.take("shed", indices)  # type: ignore[return-value]

    def shed_between(self, start: int, stop: int) -> NDArray[np.bool_]:
        return self.columns.items("shed", start, stop)  # type: ignore[return-value]

    def live(self, start: int, stop: int) -> int:
        """Requests in ``[start, stop)`` that were not shed."""
        if not self.screened:
            return stop - start
        shed = self.columns.total("shed_count", stop) - self.columns.total("shed_count", start)
        return (stop - start) - int(shed)

    def sums_at(self, index: int) -> tuple[float, ...]:
        """The running sums (``SUMS``) before request ``index``, less the shed requests'."""
        total = self.columns.total
        if not self.screened:
            return tuple(total(name, index) for name in SUMS)
        return tuple(total(name, index) - total(f"shed_{name}", index) for name in SUMS)
