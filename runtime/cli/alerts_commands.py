"""``gpupool alerts render``: rule files, alertmanager.yml, adapter rules and dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from alerts.render import render as render_bundle
from policy import load_policy
from runtime.cli.consoles import console
from runtime.cli.errors import reported_errors
from runtime.cli.policy_commands import ExampleOption, PolicyFile, policy_file

alerts_app = typer.Typer(help="Prometheus rules, Alertmanager routing and dashboard.")


@alerts_app.command()
def render(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to (re)create.")],
    file: PolicyFile = None,
    example: ExampleOption = False,
) -> None:
    """Write rules/*.yaml, alertmanager.yml, prometheus-adapter.yaml and dashboard.json.

    The directory is replaced atomically; the same policy always gives the same bytes, so
    `promtool test rules` and `amtool` can run on the output and CI can diff it.
    """
    path = policy_file(file, example=example)
    with reported_errors():
        policy = load_policy(path)
    written = render_bundle(policy, out)
    console.print(f"{out}: {len(written)} files from {path}", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(alerts_app, name="alerts")
