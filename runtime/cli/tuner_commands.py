"""``gpupool tune``: one cycle (``--once``) or a loop on a timer and on Alertmanager alerts."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from runtime.cli.consoles import err_console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.logs import configure_logging
from runtime.cli.secret_files import optional_secret, read_secret
from runtime.cli.tuner_options import (
    AtOption,
    BaseOption,
    CompactionServiceOption,
    CompactionTokenFileOption,
    CompactionUrlOption,
    DryRunOption,
    FetchOption,
    ForgeRepoOption,
    ForgeTokenFileOption,
    ListenOption,
    OnceOption,
    OpenPrOption,
    OpsListenOption,
    PolicyPathOption,
    PrometheusOption,
    RemoteOption,
    RepoOption,
    SettingsOption,
    TokenFileOption,
    TuneOptions,
    VerboseOption,
    tune_options,
)
from runtime.tuner.webhook import TOKEN_ENV

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from prometheus_api_client import PrometheusConnect

    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.webhook import Triggers

Cycle = Callable[[str], None]
"""One tuning cycle, given its trigger (``once``, ``timer`` or an alert's)."""


@dataclass(frozen=True)
class Listeners:
    """The loop's HTTP listeners (``--listen``, ``--ops-listen``; None: not served) and the
    webhook's token file."""

    listen: str | None
    ops_listen: str | None
    token_file: Path | None


def tune(
    prometheus: PrometheusOption,
    repo: RepoOption,
    once: OnceOption = False,
    dry_run: DryRunOption = False,
    listen: ListenOption = None,
    ops_listen: OpsListenOption = None,
    policy_path: PolicyPathOption = "policy/pool.yaml",
    base: BaseOption = "HEAD",
    settings_file: SettingsOption = None,
    at: AtOption = None,
    compaction_url: CompactionUrlOption = None,
    compaction_service: CompactionServiceOption = None,
    token_file: TokenFileOption = None,
    compaction_token_file: CompactionTokenFileOption = None,
    forge_token_file: ForgeTokenFileOption = None,
    open_pr: OpenPrOption = False,
    forge_repo: ForgeRepoOption = None,
    remote: RemoteOption = "origin",
    fetch: FetchOption = True,
    verbose: VerboseOption = False,
) -> None:
    """Propose policy changes from what Prometheus shows, as git branches with evidence."""
    from runtime.tuner.target import Target

    configure_logging(logging.INFO if verbose or not once else logging.WARNING)
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
            _run_loop(prometheus, options, Listeners(listen, ops_listen, token_file))


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
    """``--once``: one cycle; what a single cycle refuses (git, the policy edit) is one line."""
    from runtime.tuner.gitrepo import GitError
    from runtime.tuner.prometheus import connect
    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.yamledit import YamlEditError

    cycle = _cycle(connect(prometheus), options, TunerMetrics.create())
    try:
        cycle("once")
    except (GitError, YamlEditError, ValueError) as exc:
        raise UsageProblem(str(exc)) from None


def _run_loop(prometheus: str, options: TuneOptions, listeners: Listeners) -> None:
    """Cycles on the timer and on alerts until SIGTERM, with the listeners asked for."""
    from runtime.tuner.prometheus import connect
    from runtime.tuner.selfmetrics import TunerMetrics
    from runtime.tuner.webhook import Triggers, run_loop

    client = connect(prometheus)
    metrics = TunerMetrics.create()
    cycle = _cycle(client, options, metrics)
    triggers = Triggers()
    # SIGTERM (pod shutdown) lets the running cycle finish, then the loop returns
    signal.signal(signal.SIGTERM, lambda *_: triggers.close())
    servers = _serve(listeners, triggers, metrics)
    try:
        run_loop(cycle=cycle, triggers=triggers, interval_s=options.settings.interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.shutdown()


def _serve(
    listeners: Listeners, triggers: Triggers, metrics: TunerMetrics
) -> list[ThreadingHTTPServer]:
    """Start the listeners asked for, each announced on stderr; the servers to shut down."""
    from runtime.tuner.webhook import serve, serve_ops

    servers: list[ThreadingHTTPServer] = []
    if listeners.listen is not None:
        address = _listen_address("--listen", listeners.listen)
        token = _token(listeners.token_file)
        servers.append(serve(address, token=token, triggers=triggers, metrics=metrics))
        err_console.print(f"listening on {listeners.listen} (POST /alerts)")
    if listeners.ops_listen is not None:
        address = _listen_address("--ops-listen", listeners.ops_listen)
        servers.append(serve_ops(address, metrics=metrics))
        err_console.print(f"listening on {listeners.ops_listen} (GET /healthz, GET /metrics)")
    return servers


def _listen_address(option: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``option``, checked before its server binds."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageProblem(f"{option} expects HOST:PORT such as 0.0.0.0:9095, found {value!r}")
    return host, int(port)


def _token(token_file: Path | None) -> str:
    """The webhook's bearer token: ``--listen`` never serves without one."""
    token = read_secret("--token-file", token_file, TOKEN_ENV)
    if not token:
        raise UsageProblem(
            f"--listen needs a bearer token: set {TOKEN_ENV} or pass --token-file "
            "(the same secret as the Alertmanager receiver's http_config.authorization)"
        )
    return token


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
