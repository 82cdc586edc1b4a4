"""``validate`` and ``schema``: check a policy file and publish its JSON Schema for editors.

``policy_file`` is how ``validate``, ``render`` and ``diff`` pick the policy when FILE is
omitted, so all three read the same one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from infra.inputs import BundleInputs, load_inputs
from policy import DEFAULT_POLICY, PoolPolicy
from runtime.cli.errors import err_console, reported_errors

console = Console(highlight=False)

LOCAL_POLICY = Path("policy/pool.yaml")
"""A policy repository's own policy, relative to the current directory."""

PolicyFile = Annotated[
    Path | None,
    typer.Argument(
        help="Policy file (default: ./policy/pool.yaml if it exists, else the packaged one).",
        show_default=False,
    ),
]


def policy_file(file: Path | None) -> Path:
    """``file`` when given; else ``./policy/pool.yaml`` when it exists (the user's repository),
    else the packaged default. An omitted FILE is named on stderr, so nobody validates or
    renders the packaged example believing it is theirs."""
    if file is not None:
        return file
    if LOCAL_POLICY.exists():
        err_console.print(f"policy: {LOCAL_POLICY} (from the current directory)", markup=False)
        return LOCAL_POLICY
    err_console.print(
        f"policy: {DEFAULT_POLICY} (the packaged default; no {LOCAL_POLICY} here)", markup=False
    )
    return DEFAULT_POLICY


def print_warnings(inputs: BundleInputs) -> None:
    """What is valid but probably not meant, one located line each, on stderr (exit 0)."""
    for warning in inputs.warnings:
        err_console.print(str(warning), markup=False)


def validate(file: PolicyFile = None) -> None:
    """Check a policy file and the model configs it names, exactly as ``render`` does; print
    every problem as FILE:LINE: field: message (warnings too, on stderr, exit 0)."""
    path = policy_file(file)
    with reported_errors():
        inputs = load_inputs(path)
    print_warnings(inputs)
    policy = inputs.policy
    console.print(
        f"{path}: ok ({len(policy.node_pools)} node pools, {len(policy.workloads)} flex workloads)",
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
