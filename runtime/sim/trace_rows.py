"""Cells and rows of trace files: each malformed one a ``TraceError`` naming the file, line
and field and what was expected (shared by the production and flex parsers)."""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from typing import Final

from runtime.sim.trace_model import TraceError

MAX_INT: Final = 2**53
"""Bound on integers read (token counts, GPUs, ms): int64- and float-exact, and far past real."""


def lower(columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c.lower() for c in columns)


def header_of(first: str) -> tuple[str, ...]:
    """Line 1 as trimmed, lower-case cells: headers match exactly but for case and spaces."""
    return tuple(c.strip().lower() for c in first.split(","))


def shown(value: object) -> str:
    """A found value for a message, at most 60 characters: strings quoted, JSON values as JSON."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    if len(text) > 60:
        text = text[:56] + ("...'" if isinstance(value, str) else "...")
    return text


def shown_line(text: str) -> str:
    return shown(text) if text.strip() else "an empty line"


def expect_header(source: str, first: str, columns: tuple[str, ...]) -> None:
    if header_of(first) != lower(columns):
        raise TraceError(
            source,
            1,
            None,
            f"expected the header {','.join(columns)}, found {shown_line(first)}",
        )


def expect_rows(source: str, rows: Sequence[object]) -> None:
    if not rows:
        raise TraceError(source, None, None, "expected at least one data row, found none")


def rows(
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


def real(
    source: str, line: int, field: str, text: str, low: float, high: float, what: str
) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(source, line, field, f"expected {what}, found {text!r}") from None
    if not (low <= value <= high and math.isfinite(value)):
        raise TraceError(source, line, field, f"expected {what}, found {text!r}")
    return value


def count(source: str, line: int, field: str, text: str, *, minimum: int) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or not minimum <= int(digits) < MAX_INT:
        raise TraceError(source, line, field, f"expected an integer >= {minimum}, found {text!r}")
    return int(digits)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def peeked(lines: Iterator[str]) -> tuple[str, Iterator[str]]:
    """Line 1 and the whole stream again (line 1 included)."""
    first = next(lines, "")
    return first, itertools.chain([first], lines)
