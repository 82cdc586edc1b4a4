"""The traces the what-if engine replays, as validated, read-only numpy arrays: a production
trace (GPUs production holds and how busy they are) and a flex trace (request arrivals with
token counts and reusable KV prefixes). ``runtime.sim.traces`` reads them from files."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np
from numpy.typing import NDArray

MAX_REPLAY_REQUESTS: Final = 10_000_000
"""Most requests one trace may put into a replay once tiled to its horizon: the stream keeps
about 150 bytes a request (about 1.5 GiB at the cap; docs/design/limits.md)."""

FLEX_DTYPES: Final[dict[str, type[np.generic]]] = {
    "arrival_s": np.float64,
    "input_tokens": np.int64,
    "output_tokens": np.int64,
    "prefix_blocks": np.int64,
    "prefix_last_seen": np.float64,
}


class TraceError(ValueError):
    """One line: names the file, line (when there is one) and field, and what was expected."""

    def __init__(self, source: str, line: int | None, field: str | None, message: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.message = message
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}" if field is None else f"{where}: {field}: {message}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, int | None, str | None, str]]:
        return (type(self), (self.source, self.line, self.field, self.message))


def frozen(array: NDArray[np.generic]) -> NDArray[np.generic]:
    """A read-only view, so a frozen trace cannot be changed through its arrays."""
    view = array.view()
    view.setflags(write=False)
    return view


@dataclass(frozen=True, eq=False)
class ProductionTrace:
    """GPUs production holds, sampled every ``step_s``; each sample holds until the next.

    ``held`` is what the pool cannot lend; ``busy`` (busy GPU-equivalents, the sum of the
    held GPUs' duty cycles) is what the cluster-utilisation signal sees of production.
    """

    source: str
    start_s: float
    step_s: float
    held: NDArray[np.int64]
    busy: NDArray[np.float64]

    def __post_init__(self) -> None:
        held = np.asarray(self.held)
        busy = np.asarray(self.busy)
        if held.dtype != np.int64 or busy.dtype != np.float64:
            raise ValueError("held must be int64 and busy float64")
        if held.ndim != 1 or held.shape != busy.shape or held.size == 0:
            raise ValueError("held and busy must be 1-D, of one length, with a sample at least")
        if not (math.isfinite(self.step_s) and self.step_s > 0 and math.isfinite(self.start_s)):
            raise ValueError("step_s must be finite and > 0, start_s finite")
        if (held < 0).any() or not ((busy >= 0) & (busy <= held)).all():
            raise ValueError("need 0 <= busy <= held per sample")
        object.__setattr__(self, "held", frozen(held))
        object.__setattr__(self, "busy", frozen(busy))

    @property
    def duration_s(self) -> float:
        """Time the trace covers: every sample lasts one step."""
        return float(self.held.size * self.step_s)

    def at(self, t_s: NDArray[np.float64] | float) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """``(held, busy)`` at ``t_s`` seconds from the start: sample-and-hold, clipped to the
        first and last sample so a replay longer than the trace holds its last value."""
        t = np.asarray(t_s, dtype=np.float64)
        if not np.isfinite(t).all():
            raise ValueError("t_s must be finite")
        # the 1e-9 keeps t = k * step_s on sample k despite float division
        index = np.clip(np.floor(t / self.step_s + 1e-9), 0, self.held.size - 1).astype(np.int64)
        return np.asarray(self.held[index]), np.asarray(self.busy[index])


@dataclass(frozen=True, eq=False)
class FlexTrace:
    """Flex requests in arrival order; times are seconds from the start of the trace.

    ``prefix_blocks`` counts the request's leading prompt blocks (``block_tokens`` each) that
    an earlier request of the trace also held; ``prefix_last_seen`` is when the latest such
    request arrived (nan without a prefix), so a serving model can tell whether the cache
    still holds them.
    """

    source: str
    arrival_s: NDArray[np.float64]
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    prefix_blocks: NDArray[np.int64]
    prefix_last_seen: NDArray[np.float64]
    block_tokens: int

    def __post_init__(self) -> None:
        arrays = {name: np.asarray(getattr(self, name)) for name in FLEX_DTYPES}
        size = arrays["arrival_s"].size
        for name, dtype in FLEX_DTYPES.items():
            if arrays[name].dtype != dtype or arrays[name].ndim != 1 or arrays[name].size != size:
                raise ValueError(f"{name} must be 1-D {dtype.__name__} of {size} entries")
        arrival, blocks = arrays["arrival_s"], arrays["prefix_blocks"]
        if size and not (np.isfinite(arrival).all() and arrival[0] >= 0):
            raise ValueError("arrival_s must be finite and >= 0")
        if (np.diff(arrival) < 0).any():
            raise ValueError("arrival_s must be non-decreasing")
        if (arrays["input_tokens"] < 1).any() or (arrays["output_tokens"] < 1).any():
            raise ValueError("input_tokens and output_tokens must be >= 1")
        if self.block_tokens < 0 or (blocks < 0).any():
            raise ValueError("block_tokens and prefix_blocks must be >= 0")
        if self.block_tokens == 0 and (blocks > 0).any():
            raise ValueError("prefix_blocks must be 0 when the trace has no blocks")
        if (np.isnan(arrays["prefix_last_seen"]) != (blocks == 0)).any():
            raise ValueError("prefix_last_seen must be nan exactly where prefix_blocks == 0")
        for name, array in arrays.items():
            object.__setattr__(self, name, frozen(array))

    @property
    def duration_s(self) -> float:
        """Time from the start of the trace to its last arrival."""
        return float(self.arrival_s[-1]) if self.arrival_s.size else 0.0

    def tiled(self, horizon_s: float, rate_scale: float = 1.0) -> FlexTrace:
        """The trace repeated back to back until ``horizon_s`` (arrivals ``< horizon_s``).

        ``rate_scale`` multiplies the arrival rate by compressing time first. Copies start
        ``floor(span) + 1`` s apart (the compressed span rounded up to a whole second and
        strictly past the last arrival, so copies never overlap). Each copy keeps its own
        prefix data, shifted: a prefix never spans two copies, as if each copy were a fresh
        set of users.
        """
        if not (math.isfinite(horizon_s) and horizon_s > 0):
            raise ValueError(f"horizon_s must be finite and > 0, got {horizon_s}")
        if not (math.isfinite(rate_scale) and rate_scale > 0):
            raise ValueError(f"rate_scale must be finite and > 0, got {rate_scale}")
        # x / 1 is x: the trace's own arrays, no copy.
        arrival = self.arrival_s if rate_scale == 1 else self.arrival_s / rate_scale
        seen = self.prefix_last_seen if rate_scale == 1 else self.prefix_last_seen / rate_scale
        size = arrival.size
        period = math.floor(arrival[-1]) + 1.0 if size else horizon_s
        copies = max(1, math.ceil(horizon_s / period))
        last = (copies - 1) * period  # the last copy starts here; every earlier one fits whole
        count = (copies - 1) * size + int(np.searchsorted(arrival, horizon_s - last, "left"))
        if count > MAX_REPLAY_REQUESTS:
            raise TraceError(
                self.source,
                None,
                None,
                f"expected at most {MAX_REPLAY_REQUESTS:,} requests in a replay, found "
                f"{count:,} ({size:,} requests every {period:g} s repeated over "
                f"{horizon_s / 3600:g} h at {rate_scale:g}x rate); replay fewer hours or a "
                "lower rate",
            )
        if copies == 1:  # views, no copies: one copy's offset is 0 and x + 0.0 is x here
            return self._one_copy(
                horizon_s,
                rate_scale,
                arrival,
                seen,
                int(np.searchsorted(arrival, horizon_s, side="left")),
            )
        # The last copy's kept arrivals, then every array built at the kept length: tiling
        # whole copies and slicing would hold all of them.
        kept = int(np.searchsorted(arrival + last, horizon_s, side="left"))
        keep = (copies - 1) * size + kept
        starts = np.arange(copies, dtype=np.float64) * period
        offsets = np.repeat(starts, [size] * (copies - 1) + [kept])

        def shifted(values: NDArray[np.float64]) -> NDArray[np.float64]:
            out = _cycled(values, keep)
            out += offsets
            return out

        return FlexTrace(
            source=f"{self.source} tiled to {horizon_s:g} s at {rate_scale:g}x rate",
            arrival_s=shifted(arrival),
            input_tokens=_cycled(self.input_tokens, keep),
            output_tokens=_cycled(self.output_tokens, keep),
            prefix_blocks=_cycled(self.prefix_blocks, keep),
            prefix_last_seen=shifted(seen),
            block_tokens=self.block_tokens,
        )

    def _one_copy(
        self,
        horizon_s: float,
        rate_scale: float,
        arrival: NDArray[np.float64],
        seen: NDArray[np.float64],
        keep: int,
    ) -> FlexTrace:
        """One copy of the trace, its first ``keep`` requests, named as tiled."""
        return FlexTrace(
            source=f"{self.source} tiled to {horizon_s:g} s at {rate_scale:g}x rate",
            arrival_s=arrival[:keep],
            input_tokens=self.input_tokens[:keep],
            output_tokens=self.output_tokens[:keep],
            prefix_blocks=self.prefix_blocks[:keep],
            prefix_last_seen=seen[:keep],
            block_tokens=self.block_tokens,
        )


Values = TypeVar("Values", bound=np.generic)


def _cycled(values: NDArray[Values], size: int) -> NDArray[Values]:
    """``values`` repeated to exactly ``size`` elements (``np.resize`` joins whole copies and
    slices them, holding up to one copy more): each pass copies what is filled, a multiple of
    one copy, so the array doubles in log(copies) copies."""
    out = np.empty(size, dtype=values.dtype)
    filled = min(values.size, size)
    out[:filled] = values[:filled]
    while filled < size:
        n = min(filled, size - filled)
        out[filled : filled + n] = out[:n]
        filled += n
    return out
