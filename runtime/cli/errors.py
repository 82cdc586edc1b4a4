"""How every command reports a domain error: the problems, one per line, then exit 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from policy import PolicyError
from runtime.cli.consoles import err_console


class UsageProblem(Exception):
    """A domain error that is not about the policy file (bad model config, unreachable URL)."""


@contextmanager
def reported_errors() -> Iterator[None]:
    """Print domain errors without a traceback and exit non-zero."""
    try:
        yield
    except PolicyError as exc:
        for problem in exc.problems:
            err_console.print(str(problem), markup=False)
        raise typer.Exit(1) from None
    except UsageProblem as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from None
