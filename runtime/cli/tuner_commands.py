"""``gpupool tune``: one cycle (``--once``) or a loop on a timer and on Alertmanager alerts."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.consoles import err_console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.tuner.webhook import TOKEN_ENV

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.settings import TunerSettings
    from runtime.tuner.target import ForgeOptions, Target

Cycle = Callable[[str], None]
"""One tuning cycle, given its trigger (``once``, ``timer`` or an alert's)."""


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


def _listen_address(option: str, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageProblem(f"{option} expects HOST:PORT such as 0.0.0.0:9095, found {value!r}")
    return host, int(port)


def _secret(option: str, path: Path | None, env: str) -> str:
    """A token from ``path`` (a mounted Secret's file, what the Deployment passes) or, without
    one, from ``$env``; "" when neither holds one."""
    if path is None:
        return os.environ.get(env, "").strip()
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: {exc}") from None


def optional_secret(option: str, path: Path | None, env: str) -> str | None:
    """Like ``_secret`` for a Secret that may not exist yet: a missing file is no token (the
    kubelet fills an optional Secret's volume once it is created); read at every use."""
    if path is not None and not path.exists():
        return None
    return _secret(option, path, env) or None


def _token(token_file: Path | None) -> str:
    token = _secret("--token-file", token_file, TOKEN_ENV)
    if not token:
        raise UsageProblem(
            f"--listen needs a bearer token: set {TOKEN_ENV} or pass --token-file "
            "(the same secret as the Alertmanager receiver's http_config.authorization)"
        )
    return token


def tune(
    prometheus: Annotated[
        str, typer.Option(help="Prometheus base URL, e.g. http://prometheus:9090.")
    ],
    repo: Annotated[Path, typer.Option(help="Git repository holding the policy file.")],
    once: Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and print; write no branch, state or request.")
    ] = False,
    listen: Annotated[
        str | None,
        typer.Option(help="HOST:PORT for the Alertmanager webhook (POST /alerts)."),
    ] = None,
    ops_listen: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT for GET /healthz and GET /metrics (handlers of their own, so slow "
            "webhook clients cannot starve the probes)."
        ),
    ] = None,
    policy_path: Annotated[str, typer.Option(help="Policy file inside --repo.")] = (
        "policy/pool.yaml"
    ),
    base: Annotated[str, typer.Option(help="Ref proposals branch from.")] = "HEAD",
    settings_file: Annotated[
        Path | None,
        typer.Option("--settings", help="YAML file of tuner settings (defaults: docs/tuner.md)."),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(help="Evaluate as of this time (unix s or ISO 8601) instead of now."),
    ] = None,
    compaction_url: Annotated[
        str | None,
        typer.Option(help="Compaction worker endpoint that receives compaction requests (POST)."),
    ] = None,
    compaction_service: Annotated[
        list[str] | None,
        typer.Option(
            help="HOST:PORT of a headless Service of compaction sidecars; the request goes to "
            "every address it resolves to (repeatable). Token: --compaction-token-file."
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help=f"File with the webhook bearer token (default: ${TOKEN_ENV})."),
    ] = None,
    compaction_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File with the shared compaction token, read every cycle; while it does not "
            "exist (an optional Secret not created yet) requests go without a token "
            "(default: $GPUPOOL_COMPACTION_TOKEN)."
        ),
    ] = None,
    forge_token_file: Annotated[
        Path | None,
        typer.Option(help="File with the GitHub token of --open-pr (default: $GITHUB_TOKEN)."),
    ] = None,
    open_pr: Annotated[
        bool,
        typer.Option("--open-pr", help="Push the branch and open a GitHub PR ($GITHUB_TOKEN)."),
    ] = False,
    forge_repo: Annotated[
        str | None, typer.Option(help="OWNER/NAME of the GitHub repository.")
    ] = None,
    remote: Annotated[
        str,
        typer.Option(
            help="Git remote the --base branch is fetched from every cycle (when --repo has it) "
            "and proposal branches are pushed to."
        ),
    ] = "origin",
    fetch: Annotated[
        bool,
        typer.Option(help="Fetch the --base branch from --remote at the start of every cycle."),
    ] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every decision.")] = False,
) -> None:
    """Propose policy changes from what Prometheus shows, as git branches with evidence."""
    from runtime.tuner.target import Target

    logging.basicConfig(
        level=logging.INFO if verbose or not once else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with reported_errors():
        options = tune_options(
            settings_file=settings_file,
            compaction_services=compaction_service or (),
            at=at,
            open_pr=open_pr,
            forge_repo=forge_repo,
            forge_token_file=forge_token_file,
            target=Target(
                repo=repo, policy_path=policy_path, base=base, remote=remote, fetch=fetch
            ),
            dry_run=dry_run,
            compaction_url=compaction_url,
            compaction_token_file=compaction_token_file,
        )
        if once:
            _run_once(prometheus, options)
        else:
            _run_loop(prometheus, options, listen, ops_listen, token_file)


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
        host, _, port = service.rpartition(":")
        if not host or not port.isdigit():
            raise UsageProblem(f"--compaction-service: expected HOST:PORT, found {service!r}")
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
    token = _secret("--forge-token-file", forge_token_file, forge.TOKEN_ENV)
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


def _cycle(client: PrometheusConnect, options: TuneOptions, metrics: TunerMetrics) -> Cycle:
    """One cycle of ``options`` per trigger, its report printed."""
    from runtime.tuner import compaction
    from runtime.tuner.cycle import run_cycle

    def cycle(trigger: str) -> None:
        report = run_cycle(
            client=client,
            target=options.target,
            settings=options.settings,
            metrics=metrics,
            at=options.at,
            trigger=trigger,
            dry_run=options.dry_run,
            compaction_url=options.compaction_url,
            compaction_services=options.compaction_services,
            compaction_token=optional_secret(
                "--compaction-token-file", options.compaction_token_file, compaction.TOKEN_ENV
            ),
            forge_options=options.forge,
        )
        for line in report.lines():
            typer.echo(line)
        if options.dry_run and report.body is not None and report.proposed is not None:
            typer.echo(f"\n# {report.proposed[1]}\n\n{report.body}")

    return cycle


def _run_once(prometheus: str, options: TuneOptions) -> None:
    from runtime.tuner.gitrepo import GitError
    from runtime.tuner.prometheus import connect
    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.yamledit import YamlEditError

    cycle = _cycle(connect(prometheus), options, TunerMetrics.create())
    try:
        cycle("once")
    except (GitError, YamlEditError, ValueError) as exc:
        raise UsageProblem(str(exc)) from None


def _run_loop(
    prometheus: str,
    options: TuneOptions,
    listen: str | None,
    ops_listen: str | None,
    token_file: Path | None,
) -> None:
    """Cycles on the timer and on alerts until SIGTERM, with the listeners asked for."""
    from runtime.tuner.prometheus import connect
    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.webhook import Triggers, run_loop, serve, serve_ops

    client = connect(prometheus)
    metrics = TunerMetrics.create()
    cycle = _cycle(client, options, metrics)
    triggers = Triggers()
    # SIGTERM (pod shutdown) lets the running cycle finish, then the loop returns
    signal.signal(signal.SIGTERM, lambda *_: triggers.close())
    servers = []
    if listen is not None:
        address = _listen_address("--listen", listen)
        servers.append(serve(address, token=_token(token_file), triggers=triggers, metrics=metrics))
        err_console.print(f"listening on {listen} (POST /alerts)")
    if ops_listen is not None:
        servers.append(serve_ops(_listen_address("--ops-listen", ops_listen), metrics=metrics))
        err_console.print(f"listening on {ops_listen} (GET /healthz, GET /metrics)")
    try:
        run_loop(cycle=cycle, triggers=triggers, interval_s=options.settings.interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.shutdown()


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
