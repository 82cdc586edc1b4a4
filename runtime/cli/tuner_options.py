"""``gpupool tune``'s options: the typer declarations, and ``TuneOptions``, what every cycle
runs with, built and checked once before the first cycle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.errors import UsageProblem
from runtime.cli.options import host_port
from runtime.cli.secret_files import read_secret
from runtime.tuner.webhook import TOKEN_ENV

if TYPE_CHECKING:
    from runtime.tuner.settings import TunerSettings
    from runtime.tuner.target import ForgeOptions, Target

PrometheusOption = Annotated[
    str, typer.Option(help="Prometheus base URL, e.g. http://prometheus:9090.")
]
RepoOption = Annotated[Path, typer.Option(help="Git repository holding the policy file.")]
OnceOption = Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Decide and print; write no branch, state or request.")
]
ListenOption = Annotated[
    str | None,
    typer.Option(help="HOST:PORT for the Alertmanager webhook (POST /alerts)."),
]
OpsListenOption = Annotated[
    str | None,
    typer.Option(
        help="HOST:PORT for GET /healthz and GET /metrics (handlers of their own, so slow "
        "webhook clients cannot starve the probes)."
    ),
]
PolicyPathOption = Annotated[str, typer.Option(help="Policy file inside --repo.")]
BaseOption = Annotated[str, typer.Option(help="Ref proposals branch from.")]
SettingsOption = Annotated[
    Path | None,
    typer.Option("--settings", help="YAML file of tuner settings (defaults: docs/tuner.md)."),
]
AtOption = Annotated[
    str | None,
    typer.Option(help="Evaluate as of this time (unix s or ISO 8601) instead of now."),
]
CompactionUrlOption = Annotated[
    str | None,
    typer.Option(help="Compaction worker endpoint that receives compaction requests (POST)."),
]
CompactionServiceOption = Annotated[
    list[str] | None,
    typer.Option(
        help="HOST:PORT of a headless Service of compaction sidecars; the request goes to "
        "every address it resolves to (repeatable). Token: --compaction-token-file."
    ),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(help=f"File with the webhook bearer token (default: ${TOKEN_ENV})."),
]
CompactionTokenFileOption = Annotated[
    Path | None,
    typer.Option(
        help="File with the shared compaction token, read every cycle; while it does not "
        "exist (an optional Secret not created yet) requests go without a token "
        "(default: $GPUPOOL_COMPACTION_TOKEN)."
    ),
]
ForgeTokenFileOption = Annotated[
    Path | None,
    typer.Option(help="File with the GitHub token of --open-pr (default: $GITHUB_TOKEN)."),
]
OpenPrOption = Annotated[
    bool,
    typer.Option("--open-pr", help="Push the branch and open a GitHub PR ($GITHUB_TOKEN)."),
]
ForgeRepoOption = Annotated[str | None, typer.Option(help="OWNER/NAME of the GitHub repository.")]
RemoteOption = Annotated[
    str,
    typer.Option(
        help="Git remote the --base branch is fetched from every cycle (when --repo has it) "
        "and proposal branches are pushed to."
    ),
]
FetchOption = Annotated[
    bool,
    typer.Option(help="Fetch the --base branch from --remote at the start of every cycle."),
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Log every decision.")]


@dataclass(frozen=True)
class TuneOptions:
    """What every cycle of ``gpupool tune`` runs with, built and checked once."""

    target: Target
    settings: TunerSettings
    at: float | None
    dry_run: bool
    compaction_url: str | None
    compaction_services: tuple[str, ...]
    compaction_token_file: Path | None
    """Read at every cycle: an optional Secret may be created after the tuner starts."""
    forge: ForgeOptions | None


def tune_options(
    *,
    settings_file: Path | None,
    compaction_services: Sequence[str],
    at: str | None,
    open_pr: bool,
    forge_repo: str | None,
    forge_token_file: Path | None,
    target: Target,
    dry_run: bool,
    compaction_url: str | None,
    compaction_token_file: Path | None,
) -> TuneOptions:
    """The options of every cycle, checked in the order the command always checked them; a bad
    settings file, service, time or forge option is a ``UsageProblem`` before any cycle."""
    from runtime.tuner.settings import load_settings

    settings = load_settings(settings_file)
    for service in compaction_services:
        host_port("--compaction-service", service)
    when = None if at is None else _timestamp(at)
    return TuneOptions(
        target=target,
        settings=settings,
        at=when,
        dry_run=dry_run,
        compaction_url=compaction_url,
        compaction_services=tuple(compaction_services),
        compaction_token_file=compaction_token_file,
        forge=_forge_options(open_pr, forge_repo, forge_token_file),
    )


def _forge_options(
    open_pr: bool, forge_repo: str | None, forge_token_file: Path | None
) -> ForgeOptions | None:
    """Where ``--open-pr`` opens pull requests, checked before any side effect; None without it."""
    from runtime.tuner import forge
    from runtime.tuner.target import ForgeOptions

    if not open_pr:
        return None
    if forge_repo is None:
        raise UsageProblem("--open-pr needs --forge-repo OWNER/NAME")
    token = read_secret("--forge-token-file", forge_token_file, forge.TOKEN_ENV)
    if not token:
        raise UsageProblem(
            f"--open-pr needs a GitHub token: pass --forge-token-file FILE or set "
            f"${forge.TOKEN_ENV}"
        )
    options = ForgeOptions(repository=forge_repo, token=token)
    try:
        forge.check_pull_request_target(
            api_url=options.api_url, repository=options.repository, token=options.token
        )
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    return options


def _timestamp(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise UsageProblem(
            f"--at expects unix seconds or an ISO 8601 time such as 2026-01-01T12:00:00Z, "
            f"found {value!r}"
        ) from None
