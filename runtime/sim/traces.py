"""Edge: load the traces the what-if engine replays into validated numpy arrays.

Two kinds: a *production* trace (GPUs production holds and how busy they are, sampled on a
regular grid) that decides what the pool can lend, and a *flex* trace (request arrivals
with token counts and, where the format records prompt block hashes, reusable KV prefixes)
that the borrowed GPUs serve. Files are streamed line by line (``.gz`` transparently, within
``TRACE_BYTES``) into flat arrays by pure parsers. A malformed row is a ``TraceError``
naming the file, line and field and what was expected; nothing is skipped except blank
lines, which carry no data.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from array import array as flat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from policy.bounded_read import TRACE_BYTES, TRACE_LINE_BYTES, FileRefused, read_lines

ALIBABA_HEADER: Final = ("value", "timestamp_anon", "container_ip")
DEMAND_HEADER: Final = ("timestamp", "gpus_demanded")
DEMAND_DUTY_HEADER: Final = ("timestamp", "gpus_demanded", "duty_cycle")
AZURE_HEADER: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS: Final = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS: Final = 512
"""Prompt tokens per Mooncake ``hash_ids`` entry."""

MAX_GRID_SAMPLES: Final = 10_000_000
"""Most samples a resampled demand CSV may expand to (guards against a 1 ms outlier step)."""

MAX_REPLAY_REQUESTS: Final = 10_000_000
"""Most requests one trace may put into a replay once tiled to its horizon: the replay keeps
a few hundred bytes a request (about 2 GiB at the cap; docs/design/limits.md)."""

_MAX_INT: Final = 2**53
"""Bound on integers read (token counts, GPUs, ms): int64- and float-exact, and far past real."""

_STEP_TOLERANCE: Final = 0.01
"""Relative deviation from the median spacing that still counts as one Alibaba step."""

_BUNDLED: Final = {
    "alibaba": ("alibaba-genai", "pod_gpu_duty_cycle_half_a.csv.gz"),
    "azure-code": ("azure-llm-2023", "AzureLLMInferenceTrace_code.csv.gz"),
    "mooncake": ("mooncake", "synthetic_trace.jsonl.gz"),
}

_FLEX_DTYPES: Final[dict[str, type[np.generic]]] = {
    "arrival_s": np.float64,
    "input_tokens": np.int64,
    "output_tokens": np.int64,
    "prefix_blocks": np.int64,
    "prefix_last_seen": np.float64,
}

_AZURE_STAMP: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?", re.ASCII
)


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


def _frozen(array: NDArray[np.generic]) -> NDArray[np.generic]:
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
        object.__setattr__(self, "held", _frozen(held))
        object.__setattr__(self, "busy", _frozen(busy))

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
        arrays = {name: np.asarray(getattr(self, name)) for name in _FLEX_DTYPES}
        size = arrays["arrival_s"].size
        for name, dtype in _FLEX_DTYPES.items():
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
            object.__setattr__(self, name, _frozen(array))

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
        arrival = self.arrival_s / rate_scale
        seen = self.prefix_last_seen / rate_scale
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
        offsets = np.repeat(np.arange(copies, dtype=np.float64) * period, size)
        tiled_arrival = np.tile(arrival, copies) + offsets
        keep = int(np.searchsorted(tiled_arrival, horizon_s, side="left"))
        return FlexTrace(
            source=f"{self.source} tiled to {horizon_s:g} s at {rate_scale:g}x rate",
            arrival_s=tiled_arrival[:keep],
            input_tokens=np.tile(self.input_tokens, copies)[:keep],
            output_tokens=np.tile(self.output_tokens, copies)[:keep],
            prefix_blocks=np.tile(self.prefix_blocks, copies)[:keep],
            prefix_last_seen=(np.tile(seen, copies) + offsets)[:keep],
            block_tokens=self.block_tokens,
        )


def bundled(name: Literal["alibaba", "azure-code", "mooncake"]) -> Path:
    """Path of a trace shipped in the package (``runtime/sim/data/README.md`` cites them)."""
    if name not in _BUNDLED:
        raise ValueError(f"unknown bundled trace {name!r}; expected one of {', '.join(_BUNDLED)}")
    folder, file = _BUNDLED[name]
    path = Path(str(resources.files("runtime.sim") / "data" / folder / file))
    if not path.is_file():
        raise FileNotFoundError(
            f"bundled trace {name!r} is missing at {path}: the package was installed without "
            "its runtime/sim/data files (package-data)"
        )
    return path


# --- reading (the edge) ------------------------------------------------------------------


def _read_lines(path: Path) -> Iterator[str]:
    """The file's lines without line endings, streamed (``.gz`` inflated by suffix) within
    ``TRACE_BYTES`` and ``TRACE_LINE_BYTES``."""
    source = str(path)
    try:
        yield from read_lines(path, TRACE_BYTES, TRACE_LINE_BYTES)
    except FileNotFoundError:
        raise TraceError(source, None, None, "expected a trace file, found none") from None
    except FileRefused as exc:
        raise TraceError(source, exc.line, None, str(exc)) from None
    except OSError as exc:
        raise TraceError(source, None, None, f"cannot read the trace: {exc}") from None


def _peeked(lines: Iterator[str]) -> tuple[str, Iterator[str]]:
    """Line 1 and the whole stream again (line 1 included)."""
    first = next(lines, "")
    return first, itertools.chain([first], lines)


def load_production_trace(path: Path) -> ProductionTrace:
    """A production trace in any supported CSV format, told apart by its header line."""
    first, lines = _peeked(_read_lines(path))
    header = _header(first)
    if header == _lower(ALIBABA_HEADER):
        return _parse_alibaba(str(path), path.name, lines)
    if header in (_lower(DEMAND_HEADER), _lower(DEMAND_DUTY_HEADER)):
        return _parse_demand(str(path), path.name, lines)
    accepted = " | ".join(",".join(h) for h in (ALIBABA_HEADER, DEMAND_HEADER, DEMAND_DUTY_HEADER))
    raise TraceError(
        str(path), 1, None, f"expected one of the headers {accepted}, found {_shown_line(first)}"
    )


def load_alibaba_duty_cycle(path: Path) -> ProductionTrace:
    """Alibaba cluster-trace-v2026-GenAI ``pod_gpu_duty_cycle``: one row per container and
    sample, each container holding one GPU."""
    return _parse_alibaba(str(path), path.name, _read_lines(path))


def load_gpu_demand_csv(path: Path) -> ProductionTrace:
    """Generic ``timestamp,gpus_demanded[,duty_cycle]`` (seconds, GPUs, busy fraction).

    Without ``duty_cycle`` production GPUs read as fully busy (1.0): the conservative choice,
    since it never makes production look idler than it is, so it never invites flex load.
    Irregular samples are resampled, sample-and-hold, onto a grid of the smallest spacing.
    """
    return _parse_demand(str(path), path.name, _read_lines(path))


def load_flex_trace(path: Path) -> FlexTrace:
    """A flex trace: Mooncake JSON lines (first non-empty line starts with ``{``) or Azure CSV."""
    stream = _read_lines(path)
    line, first = 1, next(stream, "")
    while not first.strip():  # leading blank lines: counted, not kept
        following = next(stream, None)
        if following is None:
            line, first = 1, ""
            break
        line, first = line + 1, following
    lines = itertools.chain([first], stream)
    if first.lstrip().startswith("{"):
        return _parse_mooncake(str(path), path.name, lines, start=line)
    if line == 1 and _header(first) == _lower(AZURE_HEADER):
        return _parse_azure(str(path), path.name, lines)
    raise TraceError(
        str(path),
        line,
        None,
        f"expected the Azure header {','.join(AZURE_HEADER)} or Mooncake JSON lines "
        f"(starting with '{{'), found {_shown_line(first)}",
    )


def load_azure_llm(path: Path) -> FlexTrace:
    """Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``; Splitwise)."""
    return _parse_azure(str(path), path.name, _read_lines(path))


def load_mooncake(path: Path) -> FlexTrace:
    """Mooncake JSON lines (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``), with the reusable prefix of every request."""
    return _parse_mooncake(str(path), path.name, _read_lines(path))


# --- production parsers (pure) -----------------------------------------------------------


def _parse_alibaba(source: str, name: str, lines: Iterator[str]) -> ProductionTrace:
    values, times, row_lines = _alibaba_columns(source, lines)
    samples, sample_of_row = np.unique(times, return_inverse=True)
    if samples.size < 2:
        raise TraceError(
            source, None, "timestamp_anon", "expected 2 distinct timestamps at least, found 1"
        )
    spacing = np.diff(samples)
    step = float(np.median(spacing))
    off = np.flatnonzero(np.abs(spacing - step) > _STEP_TOLERANCE * step)
    if off.size:
        after = samples[off[0] + 1]
        line = int(row_lines[np.flatnonzero(times == after)[0]])
        raise TraceError(
            source,
            line,
            "timestamp_anon",
            f"expected samples every {step:g} s (the median spacing), found {after:g}, "
            f"{float(spacing[off[0]]):g} s after the previous sample",
        )
    held = np.bincount(sample_of_row, minlength=samples.size).astype(np.int64)
    busy = np.bincount(sample_of_row, weights=values / 100, minlength=samples.size)
    return ProductionTrace(name, float(samples[0]), step, held, busy.astype(np.float64))


_AlibabaColumns = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]
"""Duty cycles (%), timestamps and line numbers of the data rows."""


def _alibaba_columns(source: str, lines: Iterator[str]) -> _AlibabaColumns:
    """The columns, row by row into flat arrays (8 bytes a cell), raising at the first
    malformed row; a container reported twice at one timestamp is found afterwards."""
    _expect_header(source, next(lines, ""), ALIBABA_HEADER)
    values, stamps = flat("d"), flat("d")
    row_lines, container_of_row = flat("q"), flat("q")
    containers: dict[str, int] = {}
    for line, cells in _rows(source, lines, ALIBABA_HEADER):
        values.append(_real(source, line, "value", cells[0], 0.0, 100.0, "a duty cycle 0..100 %"))
        stamps.append(
            _real(source, line, "timestamp_anon", cells[1], 0.0, math.inf, "seconds >= 0")
        )
        container = cells[2].strip()
        if not container:
            raise TraceError(source, line, "container_ip", "expected a container id, found ''")
        container_of_row.append(containers.setdefault(container, len(containers)))
        row_lines.append(line)
    _expect_rows(source, stamps)
    times = np.frombuffer(stamps, dtype=np.float64)
    at = np.frombuffer(row_lines, dtype=np.int64)
    owner = np.frombuffer(container_of_row, dtype=np.int64)
    order = np.lexsort((at, owner, times))  # by time, container, then line
    repeat = np.flatnonzero((np.diff(times[order]) == 0) & (np.diff(owner[order]) == 0)) + 1
    if repeat.size:
        again = repeat[np.argmin(at[order][repeat])]
        repeated = np.zeros(order.size, dtype=bool)
        repeated[repeat] = True
        first = int(np.flatnonzero(~repeated[: again + 1])[-1])  # the group's first report
        row, earlier = order[again], order[first]
        names = list(containers)
        raise TraceError(
            source,
            int(at[row]),
            "container_ip",
            f"expected each container once per timestamp, found {names[owner[row]]} at "
            f"{times[row]:g} again (first on line {int(at[earlier])})",
        )
    return np.frombuffer(values, dtype=np.float64), times, at


def _parse_demand(source: str, name: str, lines: Iterator[str]) -> ProductionTrace:
    first, lines = _peeked(lines)
    columns = DEMAND_DUTY_HEADER if _header(first) == _lower(DEMAND_DUTY_HEADER) else DEMAND_HEADER
    _expect_header(source, next(lines), columns)
    stamps, gpus, duty, row_lines = flat("d"), flat("q"), flat("d"), flat("q")
    for line, cells in _rows(source, lines, columns):
        stamp = _real(source, line, "timestamp", cells[0], 0.0, math.inf, "seconds >= 0")
        if stamps and stamp <= stamps[-1]:
            raise TraceError(
                source,
                line,
                "timestamp",
                f"expected a time after the previous row's {stamps[-1]:g}, found {cells[0]!r}",
            )
        stamps.append(stamp)
        gpus.append(_count(source, line, "gpus_demanded", cells[1], minimum=0))
        duty.append(
            _real(source, line, "duty_cycle", cells[2], 0.0, 1.0, "a busy fraction 0..1")
            if len(cells) == 3
            else 1.0
        )
        row_lines.append(line)
    _expect_rows(source, stamps)
    if len(stamps) < 2:
        raise TraceError(source, None, "timestamp", "expected 2 samples at least, found 1")
    times = np.frombuffer(stamps, dtype=np.float64)
    spacing = np.diff(times)
    step = float(spacing.min())
    span = float(times[-1] - times[0])
    steps = span / step  # may be inf: compare before converting to int
    if not steps < MAX_GRID_SAMPLES:
        raise TraceError(
            source,
            row_lines[int(spacing.argmin()) + 1],
            "timestamp",
            f"expected spacing that resamples to at most {MAX_GRID_SAMPLES:,} samples, found "
            f"{step:g} s over {span:g} s ({steps:.3g} samples)",
        )
    samples = math.floor(steps + 1e-9) + 1
    grid = times[0] + np.arange(samples) * step
    row = np.searchsorted(times, grid + step * 1e-6, side="right") - 1
    held = np.frombuffer(gpus, dtype=np.int64)[row]
    busy = held * np.frombuffer(duty, dtype=np.float64)[row]
    return ProductionTrace(name, float(times[0]), step, held, busy)


def diurnal(
    *,
    hours: float,
    peak_gpus: int,
    trough_gpus: int,
    step_s: float = 60,
    duty_cycle: float = 0.5,
    seed: int,
    noise: float = 0.05,
) -> ProductionTrace:
    """A synthetic day: a cosine from ``trough_gpus`` at 04:00 to ``peak_gpus`` at 16:00.

    ``noise`` is the standard deviation of a seeded AR(1) wobble (30 min correlation time),
    as a fraction of peak minus trough: correlated, because real demand drifts rather than
    flickering per sample, and a flicker would make grow/shed thrash. The trace starts at
    00:00; ``busy = held * duty_cycle``.
    """
    if not (math.isfinite(hours) and hours > 0 and math.isfinite(step_s) and step_s > 0):
        raise ValueError("hours and step_s must be finite and > 0")
    if not 0 <= trough_gpus <= peak_gpus:
        raise ValueError(f"need 0 <= trough_gpus <= peak_gpus, got {trough_gpus}, {peak_gpus}")
    if not (0 <= duty_cycle <= 1 and math.isfinite(noise) and noise >= 0):
        raise ValueError("need 0 <= duty_cycle <= 1 and noise >= 0")
    samples = max(1, math.ceil(hours * 3600 / step_s - 1e-9))
    hour = np.arange(samples) * step_s / 3600
    level = 0.5 * (1 - np.cos(2 * np.pi * (hour - 4) / 24))
    keep = math.exp(-step_s / 1800)
    draws = np.random.default_rng(seed).standard_normal(samples).tolist()
    scale = math.sqrt(1 - keep**2)
    wobble = [draws[0]]  # starts in the stationary distribution: no warm-up drift
    for draw in draws[1:]:
        wobble.append(keep * wobble[-1] + scale * draw)
    demand = trough_gpus + (peak_gpus - trough_gpus) * (level + noise * np.asarray(wobble))
    held = np.clip(np.rint(demand), trough_gpus, peak_gpus).astype(np.int64)
    busy = (held * duty_cycle).astype(np.float64)
    return ProductionTrace(f"diurnal(seed={seed})", 0.0, float(step_s), held, busy)


def demand_csv(samples: Sequence[tuple[float, float, float | None]], *, source: str) -> str:
    """``(unix time, GPUs demanded, busy GPU-equivalents or None)`` per step -> the
    ``timestamp,gpus_demanded,duty_cycle`` CSV ``load_production_trace`` reads back
    (timestamps from the first sample, duty = busy / demanded, 0 with nothing demanded).
    Raises ``TraceError`` when production held GPUs that no busy figure covers: a made-up
    duty cycle would mislead every replay of the trace."""
    if len(samples) < 2:
        raise TraceError(
            source, None, "timestamp", f"expected 2 samples at least, found {len(samples)}"
        )
    unattributed = [t for t, demanded, busy in samples if demanded > 0 and busy is None]
    if unattributed:
        raise TraceError(
            source,
            None,
            "duty_cycle",
            f"production held GPUs at {len(unattributed)} of {len(samples)} steps that "
            "dcgm-exporter does not attribute to its pods (metrics.gpu_pod_labels), so their "
            "duty cycle is unknown",
        )
    start = samples[0][0]
    rows = [",".join(DEMAND_DUTY_HEADER)]
    for t, demanded, busy in samples:
        duty = min(max((busy or 0.0) / demanded, 0.0), 1.0) if demanded > 0 else 0.0
        rows.append(f"{t - start:g},{round(demanded)},{duty:.6f}")
    return "\n".join(rows) + "\n"


# --- flex parsers (pure) -----------------------------------------------------------------


def _parse_azure(source: str, name: str, lines: Iterator[str]) -> FlexTrace:
    _expect_header(source, next(lines, ""), AZURE_HEADER)
    first: int | None = None
    previous = 0
    arrival, context, generated = flat("d"), flat("q"), flat("q")
    for line, cells in _rows(source, lines, AZURE_HEADER):
        tick = _azure_ns(source, line, cells[0])
        if first is None:
            first = previous = tick
        if tick < previous:
            raise TraceError(
                source,
                line,
                "TIMESTAMP",
                f"expected a time at or after the previous row's, found {cells[0].strip()!r}",
            )
        previous = tick
        arrival.append((tick - first) / 1e9)
        context.append(_count(source, line, "ContextTokens", cells[1], minimum=1))
        generated.append(_count(source, line, "GeneratedTokens", cells[2], minimum=1))
    _expect_rows(source, arrival)
    size = len(arrival)
    return FlexTrace(
        source=name,
        arrival_s=np.frombuffer(arrival, dtype=np.float64),
        input_tokens=np.frombuffer(context, dtype=np.int64),
        output_tokens=np.frombuffer(generated, dtype=np.int64),
        prefix_blocks=np.zeros(size, dtype=np.int64),
        prefix_last_seen=np.full(size, np.nan),
        block_tokens=0,
    )


def _azure_ns(source: str, line: int, text: str) -> int:
    """Nanoseconds since 0001-01-01 as an exact int: datetime takes at most 6 fractional
    digits, and float seconds since the epoch would blur the 7th."""
    match = _AZURE_STAMP.fullmatch(text.strip())
    expected = "YYYY-MM-DD HH:MM:SS[.fffffff]"
    if match is None:
        raise TraceError(source, line, "TIMESTAMP", f"expected {expected}, found {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        moment = datetime(year, month, day, hour, minute, second)
    except ValueError:
        raise TraceError(
            source, line, "TIMESTAMP", f"expected a real date and time, found {text!r}"
        ) from None
    fraction = (match.group(7) or "").ljust(9, "0")
    whole = moment.toordinal() * 86_400 + hour * 3600 + minute * 60 + second
    return whole * 1_000_000_000 + int(fraction)


def _parse_mooncake(source: str, name: str, lines: Iterator[str], start: int = 1) -> FlexTrace:
    stamps, inputs, outputs = flat("d"), flat("q"), flat("q")
    flat_ids, id_counts = flat("q"), flat("q")
    previous: float = 0.0
    for line, text in enumerate(lines, start):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(
                source, line, None, f"expected a JSON object, found bad JSON ({exc.msg})"
            ) from None
        except RecursionError:
            raise TraceError(
                source, line, None, "expected a JSON object, found JSON nested too deeply"
            ) from None
        if not isinstance(record, dict):
            raise TraceError(
                source, line, None, f"expected a JSON object, found {type(record).__name__}"
            )
        for key in MOONCAKE_KEYS:
            if key not in record:
                raise TraceError(source, line, key, "expected this key, found it missing")
        stamp = record["timestamp"]
        if not (_is_number(stamp) and 0 <= stamp < _MAX_INT):
            raise TraceError(
                source, line, "timestamp", f"expected milliseconds >= 0, found {stamp!r}"
            )
        if stamps and stamp < previous:
            raise TraceError(
                source,
                line,
                "timestamp",
                f"expected a time at or after the previous row's {previous!r}, found {stamp!r}",
            )
        previous = stamp
        for key in ("input_length", "output_length"):
            tokens = record[key]
            if type(tokens) is not int or not 1 <= tokens < _MAX_INT:
                raise TraceError(
                    source, line, key, f"expected an integer >= 1, found {_shown(tokens)}"
                )
        ids = record["hash_ids"]
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise TraceError(
                source, line, "hash_ids", f"expected a list of integers, found {_shown(ids)}"
            )
        if ids and not -_MAX_INT < min(ids) <= max(ids) < _MAX_INT:
            raise TraceError(
                source, line, "hash_ids", f"expected ids below 2^53 in size, found {_shown(ids)}"
            )
        blocks = -(-record["input_length"] // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != blocks:
            raise TraceError(
                source,
                line,
                "hash_ids",
                f"expected {blocks} ids (one per {MOONCAKE_BLOCK_TOKENS} input tokens), "
                f"found {len(ids)}",
            )
        stamps.append(stamp)
        inputs.append(record["input_length"])
        outputs.append(record["output_length"])
        flat_ids.extend(ids)
        id_counts.append(len(ids))
    _expect_rows(source, stamps)
    arrival = (np.frombuffer(stamps, dtype=np.float64) - stamps[0]) / 1000
    input_tokens = np.frombuffer(inputs, dtype=np.int64)
    blocks, last_seen = _prefix_reuse_flat(
        arrival,
        input_tokens,
        np.frombuffer(flat_ids, dtype=np.int64),
        np.frombuffer(id_counts, dtype=np.int64),
        MOONCAKE_BLOCK_TOKENS,
    )
    return FlexTrace(
        source=name,
        arrival_s=arrival,
        input_tokens=input_tokens,
        output_tokens=np.frombuffer(outputs, dtype=np.int64),
        prefix_blocks=blocks,
        prefix_last_seen=last_seen,
        block_tokens=MOONCAKE_BLOCK_TOKENS,
    )


def prefix_reuse(
    arrival_s: NDArray[np.float64],
    input_tokens: NDArray[np.int64],
    hash_ids: Sequence[Sequence[int]],
    block_tokens: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``(prefix_blocks, prefix_last_seen)`` of requests given in arrival order.

    A request's prefix is its leading block ids that each appeared in some earlier request,
    up to the first new one, capped so ``blocks * block_tokens <= input_tokens - 1`` (vLLM
    always computes the last prompt token). ``prefix_last_seen`` is the latest earlier
    arrival that held the prefix's last block: the one an LRU cache would have kept longest.
    """
    laid = np.fromiter(itertools.chain.from_iterable(hash_ids), dtype=np.int64)
    counts = np.fromiter((len(ids) for ids in hash_ids), dtype=np.int64, count=len(hash_ids))
    return _prefix_reuse_flat(arrival_s, input_tokens, laid, counts, block_tokens)


def _prefix_reuse_flat(
    arrival_s: NDArray[np.float64],
    input_tokens: NDArray[np.int64],
    flat_ids: NDArray[np.int64],
    counts: NDArray[np.int64],
    block_tokens: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``prefix_reuse`` of the requests' ids laid end to end (``counts`` a request), by
    sorting rather than a dict of every id seen: a few flat arrays of ``flat_ids``'s length
    (tens of bytes an id) instead of a Python object per id."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    size = counts.size
    if arrival_s.size != size or input_tokens.size != size:
        raise ValueError("arrival_s, input_tokens and hash_ids must have one entry a request")
    if flat_ids.size >= 2**31:  # TRACE_BYTES keeps a trace far below: an id takes 2 bytes
        raise ValueError(f"at most 2^31 hash ids, got {flat_ids.size}")
    request = np.repeat(np.arange(size, dtype=np.int32), counts)
    order = np.argsort(flat_ids, kind="stable").astype(np.int32)  # by id, then by request
    same_id = np.diff(flat_ids[order]) == 0
    by_request = request[order]
    del request
    run_start = np.ones(order.size, dtype=bool)  # a run: one id within one request
    run_start[1:] = ~same_id | (np.diff(by_request) != 0)
    # the request before this run that held the id (-1: none), carried along the run
    before = np.full(order.size, -1, dtype=np.int32)
    starts = np.flatnonzero(run_start)
    later = starts[starts > 0]
    before[later] = np.where(same_id[later - 1], by_request[later - 1], -1)
    del same_id, by_request, starts, later
    fill = np.arange(order.size, dtype=np.int32)
    fill[~run_start] = 0
    np.maximum.accumulate(fill, out=fill)
    held_before = np.empty(order.size, dtype=np.int32)
    held_before[order] = before[fill]
    del order, before, fill, run_start
    first = np.cumsum(counts) - counts
    new = np.flatnonzero(held_before < 0)
    miss = np.searchsorted(new, first)
    run = np.minimum(np.append(new, flat_ids.size)[miss] - first, counts)
    blocks = np.minimum(run, np.maximum(input_tokens - 1, 0) // block_tokens).astype(np.int64)
    last_seen = np.full(size, np.nan)
    has = np.flatnonzero(blocks > 0)
    last_seen[has] = arrival_s[held_before[first[has] + blocks[has] - 1]]
    return blocks, last_seen


# --- cells and rows ----------------------------------------------------------------------


def _lower(columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c.lower() for c in columns)


def _header(first: str) -> tuple[str, ...]:
    """Line 1 as trimmed, lower-case cells: headers match exactly but for case and spaces."""
    return tuple(c.strip().lower() for c in first.split(","))


def _shown(value: object) -> str:
    """A found value for a message, at most 60 characters: strings quoted, JSON values as JSON."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    if len(text) > 60:
        text = text[:56] + ("...'" if isinstance(value, str) else "...")
    return text


def _shown_line(text: str) -> str:
    return _shown(text) if text.strip() else "an empty line"


def _expect_header(source: str, first: str, columns: tuple[str, ...]) -> None:
    if _header(first) != _lower(columns):
        raise TraceError(
            source,
            1,
            None,
            f"expected the header {','.join(columns)}, found {_shown_line(first)}",
        )


def _expect_rows(source: str, rows: Sequence[object]) -> None:
    if not rows:
        raise TraceError(source, None, None, "expected at least one data row, found none")


def _rows(
    source: str, lines: Iterator[str], columns: tuple[str, ...]
) -> Iterator[tuple[int, list[str]]]:
    """``(line, cells)`` of each non-blank data row (``lines`` from line 2 on), with exactly
    ``len(columns)`` cells."""
    reader = csv.reader(lines)
    want = len(columns)
    expected = f"expected {want} columns ({','.join(columns)})"
    try:
        for cells in reader:
            line = reader.line_num + 1
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if len(cells) < want:
                raise TraceError(
                    source, line, columns[len(cells)], f"{expected}, found {len(cells)}"
                )
            if len(cells) > want:
                raise TraceError(
                    source, line, f"column {want + 1}", f"{expected}, found {len(cells)}"
                )
            yield line, cells
    except csv.Error as exc:
        raise TraceError(source, reader.line_num + 1, None, f"expected CSV, found {exc}") from None


def _real(
    source: str, line: int, field: str, text: str, low: float, high: float, what: str
) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(source, line, field, f"expected {what}, found {text!r}") from None
    if not (low <= value <= high and math.isfinite(value)):
        raise TraceError(source, line, field, f"expected {what}, found {text!r}")
    return value


def _count(source: str, line: int, field: str, text: str, *, minimum: int) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or not minimum <= int(digits) < _MAX_INT:
        raise TraceError(source, line, field, f"expected an integer >= {minimum}, found {text!r}")
    return int(digits)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
