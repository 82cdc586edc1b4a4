"""The service model's latency tables and their numpy-only lookup (``runtime.sim.service_time``
describes the grids, the interpolation and its error)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
Values = NDArray[Any] | float
"""What the lookups accept: a number or an array of any real dtype (token counts are ints)."""

MAX_BATCH_GRID = 512
"""Largest decode batch tabulated; larger batches extrapolate the last segment."""
MIN_CONTEXT_GRID = 128
MIN_PREFILL_GRID = 16


@dataclass(frozen=True)
class StepTables:
    """Latency tables (seconds) on their grids; read-only arrays shared by every user."""

    batch: Array
    context: Array
    tokens: Array
    decode_s: Array
    """``decode_s[i, j]``: one decode step of ``batch[i]`` sequences at context ``context[j]``."""
    prefill_s: Array
    """``prefill_s[k]``: prefill of a ``tokens[k]``-token prompt at batch 1."""
    lookup: _Lookup = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lookup", _Lookup.of(self))


@dataclass(frozen=True)
class _Lookup:
    """The tables prepared for numpy-only lookups.

    Each axis gets a far sentinel point whose values continue the last segment, so that
    ``np.interp`` (which clamps) extrapolates linearly past the grid and clamps below it. A
    decode query's fractional cell index comes from ``np.interp`` over the axis positions; the
    bilinear form ``base + u d_batch + v (d_context + u twist)`` of every cell is precomputed
    (flattened), so a lookup is two ``interp`` and four ``take`` calls.
    """

    tokens: Array
    prefill_s: Array
    batch: Array
    context: Array
    batch_positions: Array
    context_positions: Array
    cells_per_row: int
    last_batch_cell: int
    last_context_cell: int
    base: Array
    d_batch: Array
    d_context: Array
    twist: Array

    @classmethod
    def of(cls, tables: StepTables) -> _Lookup:
        tokens, prefill = _extend(tables.tokens, tables.prefill_s, axis=0)
        batch, d = _extend(tables.batch, tables.decode_s, axis=0)
        context, d = _extend(tables.context, d, axis=1)
        d00, d10, d01, d11 = d[:-1, :-1], d[1:, :-1], d[:-1, 1:], d[1:, 1:]
        arrays = [
            np.ascontiguousarray(a, dtype=np.float64).ravel()
            for a in (d00, d10 - d00, d01 - d00, d11 - d10 - d01 + d00)
        ]
        batch_positions = np.arange(batch.size, dtype=np.float64)
        context_positions = np.arange(context.size, dtype=np.float64)
        for array in (tokens, prefill, batch, context, batch_positions, context_positions, *arrays):
            array.setflags(write=False)
        return cls(
            tokens,
            prefill,
            batch,
            context,
            batch_positions,
            context_positions,
            context.size - 1,
            batch.size - 2,
            context.size - 2,
            *arrays,
        )


SENTINEL_FACTOR = 2.0**20
"""The sentinel sits this many times past an axis' last point (extrapolation ends there)."""


def _extend(grid: Array, values: Array, *, axis: int) -> tuple[Array, Array]:
    """Append the sentinel to ``grid`` and the last segment's linear continuation to ``values``
    along ``axis``."""
    far = grid[-1] * SENTINEL_FACTOR
    last = np.take(values, [-1], axis=axis)
    slope = (last - np.take(values, [-2], axis=axis)) / (grid[-1] - grid[-2])
    extended = np.concatenate([values, last + slope * (far - grid[-1])], axis=axis)
    return np.append(grid, far), extended


def tabulate(
    max_context: int,
    decode: Callable[[float, float], float],
    prefill: Callable[[float], float],
) -> StepTables:
    """``decode(batch, context)`` and ``prefill(tokens)`` sampled on the grids up to
    ``max_context``, made monotone along each axis."""
    batch = _grid(1, MAX_BATCH_GRID)
    context = _grid(min(MIN_CONTEXT_GRID, max_context), max_context)
    tokens = _grid(min(MIN_PREFILL_GRID, max_context), max_context)
    decode_s = np.array([[decode(b, c) for c in context] for b in batch], dtype=np.float64)
    prefill_s = np.array([prefill(n) for n in tokens], dtype=np.float64)
    # Measured data wobbles by up to ~1 %; queueing needs more work never to be faster.
    decode_s = np.maximum.accumulate(np.maximum.accumulate(decode_s, axis=0), axis=1)
    prefill_s = np.maximum.accumulate(prefill_s)
    arrays = (batch, context, tokens, decode_s, prefill_s)
    for array in arrays:
        array.setflags(write=False)
    return StepTables(*arrays)


def _grid(low: int, high: int) -> Array:
    """Powers of two from ``low`` and their x1.5 midpoints up to ``high`` (included); at least
    two points."""
    points: set[int] = set()
    value = low
    while value <= high:
        points.update({value, value * 3 // 2} if value > 1 else {value})
        value *= 2
    points = {p for p in points if p <= high} | {high}
    if len(points) < 2:
        points.add(2 * high)
    return np.array(sorted(points), dtype=np.float64)
