"""Tables a person reads whole, at any width: never a value cut short with an ellipsis.

On a terminal a Rich table whose cells wrap, and fold where one word is wider than its
column; anywhere else (a pipe, a file, a CI log) a markdown table, one line per row, which
no width cuts and which pastes into an issue or a pull request as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """GitHub-flavoured markdown lines of a table (``|`` in a cell escaped)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(headers), "|" + "---|" * len(headers), *(line(row) for row in rows)]


def rich_table(headers: Sequence[str], *, title: str | None = None) -> Table:
    """A Rich table whose cells wrap or fold, never end in an ellipsis."""
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def print_table(
    console: Console,
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    title: str | None = None,
) -> None:
    """``rich_table`` on a terminal, ``markdown_table`` (after its title) anywhere else."""
    if console.is_terminal:
        table = rich_table(headers, title=title)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    for text in [*([title] if title else []), *markdown_table(headers, rows)]:
        console.print(text, markup=False, soft_wrap=True)
