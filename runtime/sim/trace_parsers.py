"""Pure parsers of trace files, line by line into flat arrays: production (Alibaba duty
cycles, the generic demand CSV) and flex (Azure LLM CSV, Mooncake JSON lines with their
reusable prefixes)."""

from __future__ import annotations

import itertools
import json
import math
import re
from array import array as flat
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from runtime.sim.trace_model import FlexTrace, ProductionTrace, TraceError
from runtime.sim.trace_rows import (
    MAX_INT,
    count,
    expect_header,
    expect_rows,
    header_of,
    is_number,
    lower,
    peeked,
    real,
    rows,
    shown,
)

ALIBABA_HEADER: Final = ("value", "timestamp_anon", "container_ip")
DEMAND_HEADER: Final = ("timestamp", "gpus_demanded")
DEMAND_DUTY_HEADER: Final = ("timestamp", "gpus_demanded", "duty_cycle")
AZURE_HEADER: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS: Final = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS: Final = 512
"""Prompt tokens per Mooncake ``hash_ids`` entry."""

MAX_GRID_SAMPLES: Final = 10_000_000
"""Most samples a resampled demand CSV may expand to (guards against a 1 ms outlier step)."""

STEP_TOLERANCE: Final = 0.01
"""Relative deviation from the median spacing that still counts as one Alibaba step."""

AZURE_STAMP: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?", re.ASCII
)


# --- production ---------------------------------------------------------------------------


def parse_alibaba(source: str, name: str, lines: Iterator[str]) -> ProductionTrace:
    values, times, row_lines = _alibaba_columns(source, lines)
    samples, sample_of_row = np.unique(times, return_inverse=True)
    if samples.size < 2:
        raise TraceError(
            source, None, "timestamp_anon", "expected 2 distinct timestamps at least, found 1"
        )
    spacing = np.diff(samples)
    step = float(np.median(spacing))
    off = np.flatnonzero(np.abs(spacing - step) > STEP_TOLERANCE * step)
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
    expect_header(source, next(lines, ""), ALIBABA_HEADER)
    values, stamps = flat("d"), flat("d")
    row_lines, container_of_row = flat("q"), flat("q")
    containers: dict[str, int] = {}
    for line, cells in rows(source, lines, ALIBABA_HEADER):
        values.append(real(source, line, "value", cells[0], 0.0, 100.0, "a duty cycle 0..100 %"))
        stamps.append(real(source, line, "timestamp_anon", cells[1], 0.0, math.inf, "seconds >= 0"))
        container = cells[2].strip()
        if not container:
            raise TraceError(source, line, "container_ip", "expected a container id, found ''")
        container_of_row.append(containers.setdefault(container, len(containers)))
        row_lines.append(line)
    expect_rows(source, stamps)
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


def parse_demand(source: str, name: str, lines: Iterator[str]) -> ProductionTrace:
    first, lines = peeked(lines)
    columns = DEMAND_DUTY_HEADER if header_of(first) == lower(DEMAND_DUTY_HEADER) else DEMAND_HEADER
    expect_header(source, next(lines), columns)
    stamps, gpus, duty, row_lines = flat("d"), flat("q"), flat("d"), flat("q")
    for line, cells in rows(source, lines, columns):
        stamp = real(source, line, "timestamp", cells[0], 0.0, math.inf, "seconds >= 0")
        if stamps and stamp <= stamps[-1]:
            raise TraceError(
                source,
                line,
                "timestamp",
                f"expected a time after the previous row's {stamps[-1]:g}, found {cells[0]!r}",
            )
        stamps.append(stamp)
        gpus.append(count(source, line, "gpus_demanded", cells[1], minimum=0))
        duty.append(
            real(source, line, "duty_cycle", cells[2], 0.0, 1.0, "a busy fraction 0..1")
            if len(cells) == 3
            else 1.0
        )
        row_lines.append(line)
    expect_rows(source, stamps)
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


# --- flex ---------------------------------------------------------------------------------


def parse_azure(source: str, name: str, lines: Iterator[str]) -> FlexTrace:
    expect_header(source, next(lines, ""), AZURE_HEADER)
    first: int | None = None
    previous = 0
    arrival, context, generated = flat("d"), flat("q"), flat("q")
    for line, cells in rows(source, lines, AZURE_HEADER):
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
        context.append(count(source, line, "ContextTokens", cells[1], minimum=1))
        generated.append(count(source, line, "GeneratedTokens", cells[2], minimum=1))
    expect_rows(source, arrival)
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
    match = AZURE_STAMP.fullmatch(text.strip())
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


def parse_mooncake(source: str, name: str, lines: Iterator[str], start: int = 1) -> FlexTrace:
    stamps, inputs, outputs = flat("d"), flat("q"), flat("q")
    flat_ids, id_counts = flat("q"), flat("q")
    previous = None  # the last row's timestamp as written (its message shows it so)
    for line, text in enumerate(lines, start):
        if not text.strip():
            continue
        record = _mooncake_record(source, line, text)
        _check_stamp(source, line, record["timestamp"], previous)
        previous = record["timestamp"]
        ids = _mooncake_ids(source, line, record)
        stamps.append(record["timestamp"])
        inputs.append(record["input_length"])
        outputs.append(record["output_length"])
        flat_ids.extend(ids)
        id_counts.append(len(ids))
    expect_rows(source, stamps)
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


def _mooncake_record(source: str, line: int, text: str) -> dict[str, Any]:
    """One line as a JSON object holding every Mooncake key."""
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
    return record


def _check_stamp(source: str, line: int, stamp: object, previous: object) -> None:
    """Milliseconds >= 0, in order (at or after the previous row's, where there is one)."""
    if not (is_number(stamp) and 0 <= stamp < MAX_INT):  # type: ignore[operator]
        raise TraceError(source, line, "timestamp", f"expected milliseconds >= 0, found {stamp!r}")
    if previous is not None and stamp < previous:  # type: ignore[operator]
        raise TraceError(
            source,
            line,
            "timestamp",
            f"expected a time at or after the previous row's {previous!r}, found {stamp!r}",
        )


def _mooncake_ids(source: str, line: int, record: dict[str, Any]) -> list[int]:
    """The token counts checked, and the prompt's block ids: one per block of input."""
    for key in ("input_length", "output_length"):
        tokens = record[key]
        if type(tokens) is not int or not 1 <= tokens < MAX_INT:
            raise TraceError(source, line, key, f"expected an integer >= 1, found {shown(tokens)}")
    ids = record["hash_ids"]
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise TraceError(
            source, line, "hash_ids", f"expected a list of integers, found {shown(ids)}"
        )
    if ids and not -MAX_INT < min(ids) <= max(ids) < MAX_INT:
        raise TraceError(
            source, line, "hash_ids", f"expected ids below 2^53 in size, found {shown(ids)}"
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
    return ids


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
