"""Edge: read a request trace in the Azure LLM inference format (``TIMESTAMP,ContextTokens,
GeneratedTokens``; Splitwise, ISCA'24). A malformed row is an error naming the file and line,
never skipped."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from policy.bounded_read import TRACE_BYTES, TRACE_LINE_BYTES, FileRefused, read_lines

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace file that cannot be read; the message starts with ``FILE:LINE``."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrived and how many tokens it holds in the KV cache."""

    arrival: datetime
    context_tokens: int
    generated_tokens: int

    @property
    def total_tokens(self) -> int:
        """Tokens the sequence holds in the KV cache when it finishes (prompt + output)."""
        return self.context_tokens + self.generated_tokens


def load_azure_trace(path: Path) -> list[TraceRequest]:
    """Every request of an Azure-format CSV, in file order."""
    try:
        rows = list(csv.reader(read_lines(path, TRACE_BYTES, TRACE_LINE_BYTES)))
    except FileNotFoundError:
        raise TraceError(f"{path}:0: file not found") from None
    except FileRefused as exc:
        raise TraceError(f"{path}:{exc.line or 0}: {exc}") from None
    except (OSError, csv.Error) as exc:
        raise TraceError(f"{path}:0: cannot read trace: {exc}") from None
    if not rows or tuple(c.strip() for c in rows[0]) != AZURE_COLUMNS:
        found = ",".join(rows[0]) if rows else "an empty file"
        raise TraceError(f"{path}:1: expected the header {','.join(AZURE_COLUMNS)}, found {found}")
    requests = [_parse_row(row, path, number) for number, row in enumerate(rows[1:], start=2)]
    if not requests:
        raise TraceError(f"{path}:1: the trace has a header but no requests")
    return requests


def _parse_row(row: list[str], path: Path, line: int) -> TraceRequest:
    if len(row) != len(AZURE_COLUMNS):
        raise TraceError(f"{path}:{line}: expected 3 columns, found {len(row)}: {row!r}")
    stamp, context, generated = (cell.strip() for cell in row)
    try:
        arrival = datetime.fromisoformat(stamp[:26])
    except ValueError:
        raise TraceError(
            f"{path}:{line}: TIMESTAMP: expected YYYY-MM-DD HH:MM:SS.fffffff, found {stamp!r}"
        ) from None
    return TraceRequest(
        arrival,
        _tokens(context, "ContextTokens", path, line, minimum=1),
        _tokens(generated, "GeneratedTokens", path, line, minimum=0),
    )


def _tokens(text: str, column: str, path: Path, line: int, *, minimum: int) -> int:
    if not text.isdigit() or int(text) < minimum:
        raise TraceError(
            f"{path}:{line}: {column}: expected an integer >= {minimum}, found {text!r}"
        )
    return int(text)
