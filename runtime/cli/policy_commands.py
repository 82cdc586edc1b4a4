"""``validate`` and ``schema``: check a policy file and publish its JSON Schema for editors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from policy import DEFAULT_POLICY, PoolPolicy, load_policy
from runtime.cli.errors import reported_errors

console = Console(highlight=False)

PolicyFile = Annotated[
    Path, typer.Argument(help="Policy file (default: the embedded policy/pool.yaml).")
]


def validate(file: PolicyFile = DEFAULT_POLICY) -> None:
    """Check a policy file; print every problem as FILE:LINE: field: message."""
    with reported_errors():
        policy = load_policy(file)
    console.print(
        f"{file}: ok ({len(policy.node_pools)} node pools, {len(policy.workloads)} flex workloads)",
        markup=False,
    )


def schema(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """Print the policy's JSON Schema (editors use it to check pool.yaml while it is typed)."""
    text = json.dumps(PoolPolicy.model_json_schema(by_alias=True), indent=2, sort_keys=True) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(schema)
