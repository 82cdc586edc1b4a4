"""``validate`` and ``schema``: check a policy file and publish its JSON Schema for editors.

``policy_file`` is how every command that reads a policy picks it: the file given, else
``./policy/pool.yaml``; the packaged example only with ``--example``. Outside a policy
repository a command refuses with one line that names ``gpupool init`` and ``--example``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from infra.inputs import BundleInputs, load_inputs
from policy import DEFAULT_POLICY, PoolPolicy
from runtime.atomic_file import OutputError, write_atomic
from runtime.cli.consoles import console, err_console
from runtime.cli.errors import UsageProblem, reported_errors

LOCAL_POLICY = Path("policy/pool.yaml")
"""A policy repository's own policy, relative to the current directory."""

PolicyFile = Annotated[
    Path | None,
    typer.Argument(
        help="Policy file (default: ./policy/pool.yaml).",
        show_default=False,
    ),
]
PolicyOption = Annotated[
    Path | None,
    typer.Option("--policy", help="Policy file (default: ./policy/pool.yaml).", show_default=False),
]
ExampleOption = Annotated[
    bool,
    typer.Option(
        "--example",
        help="Use the packaged example policy (an H200 demo cluster, not yours).",
    ),
]


def no_policy_line(cwd: Path | None = None) -> str:
    """The one line a command prints outside a policy repository."""
    here = cwd or Path.cwd()
    return (
        f"error: no {LOCAL_POLICY} in {here} (not a policy repository): run `gpupool init` to "
        "write your cluster's policy, give a policy file, or pass --example for the packaged "
        "example"
    )


def policy_file(file: Path | None, *, example: bool = False) -> Path:
    """``file`` when given; else ``./policy/pool.yaml`` (the user's repository); the packaged
    example only with ``example`` (``--example``). Without a file and outside a policy
    repository the command stops with ``no_policy_line`` (exit 2): a CI job in the wrong folder
    must fail, not validate the example. The policy picked without FILE is named on stderr."""
    if example:
        if file is not None:
            _refuse(f"error: give a policy file ({file}) or --example, not both")
        err_console.print(
            f"policy: {DEFAULT_POLICY} (the packaged example, --example)", markup=False
        )
        return DEFAULT_POLICY
    if file is not None:
        return file
    if LOCAL_POLICY.exists() or LOCAL_POLICY.is_symlink():
        err_console.print(f"policy: {LOCAL_POLICY} (from the current directory)", markup=False)
        return LOCAL_POLICY
    _refuse(no_policy_line())


def _refuse(line: str) -> NoReturn:
    err_console.print(line, markup=False)
    raise typer.Exit(NO_POLICY_EXIT)


NO_POLICY_EXIT = 2
"""Exit status without a policy to read (a usage error, as for a missing argument)."""


def print_warnings(inputs: BundleInputs) -> None:
    """What is valid but probably not meant, one located line each, on stderr (exit 0)."""
    for warning in inputs.warnings:
        err_console.print(str(warning), markup=False)


def input_files(path: Path, policy: PoolPolicy) -> list[Path]:
    """The policy file and the model configs it names: no output may touch them."""
    return [path, *(path.parent / w.hf_config for w in policy.workloads)]


def validate(file: PolicyFile = None, example: ExampleOption = False) -> None:
    """Check a policy file and the model configs it names, exactly as ``render`` does; print
    every problem as FILE:LINE: field: message (warnings too, on stderr, exit 0)."""
    path = policy_file(file, example=example)
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
        return
    with reported_errors():
        try:
            write_atomic(out, text)
        except OutputError as exc:
            raise UsageProblem(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(schema)
