"""``gpupool alerts render``: rule files, alertmanager.yml, adapter rules and dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from alerts.render import render as render_bundle
from policy import DEFAULT_POLICY, load_policy
from runtime.cli.errors import reported_errors

console = Console(highlight=False)
alerts_app = typer.Typer(help="Prometheus rules, Alertmanager routing and dashboard.")


@alerts_app.command()
def render(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to (re)create.")],
    file: Annotated[
        Path, typer.Argument(help="Policy file (default: the embedded policy/pool.yaml).")
    ] = DEFAULT_POLICY,
) -> None:
    """Write rules/*.yaml, alertmanager.yml, prometheus-adapter.yaml and dashboard.json.

    The directory is replaced atomically; the same policy always gives the same bytes, so
    `promtool test rules` and `amtool` can run on the output and CI can diff it.
    """
    with reported_errors():
        policy = load_policy(file)
    written = render_bundle(policy, out)
    console.print(f"{out}: {len(written)} files from {file}", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(alerts_app, name="alerts")
