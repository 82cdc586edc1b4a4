"""``gpupool kv-sidecar``: the compaction sidecar loop, and one-shot requests to the plugin."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from infra.builders.compaction_sidecar import SOCKET_PATH, TOKEN_PATH
from policy import load_policy
from policy.base import duration_seconds
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.logs import configure_logging
from runtime.cli.options import host_port
from runtime.cli.policy_commands import ExampleOption, policy_file
from runtime.kvcache.control import ControlClient, ControlError, Op, read_token
from runtime.kvcache.limits import CompactionLimits

if TYPE_CHECKING:
    from runtime.kvcache.sidecar.service import CompactionSidecar

kv_app = typer.Typer(
    name="kv-sidecar",
    help="KV-cache compaction: run the sidecar, or ask the engine's plugin directly.",
    no_args_is_help=True,
)

SocketOpt = Annotated[Path, typer.Option("--socket", help="The plugin's control socket.")]
TokenOpt = Annotated[Path, typer.Option("--token-file", help="File holding the control token.")]
PolicyOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        help="Policy file with the triggers (default: ./policy/pool.yaml).",
        show_default=False,
    ),
]


def _token(token_file: Path) -> str:
    """The token in ``token_file``; an unreadable one is one line."""
    try:
        return read_token(token_file)
    except ControlError as exc:
        raise UsageProblem(str(exc)) from None


def _client(socket: Path, token_file: Path) -> ControlClient:
    """A client of the plugin's control socket, with the token it requires."""
    return ControlClient(socket, _token(token_file))


def _call(socket: Path, token_file: Path, op: Op, **args: Any) -> None:
    with reported_errors():
        try:
            reply = _client(socket, token_file).call(op, **args)
        except ControlError as exc:
            raise UsageProblem(str(exc)) from None
        typer.echo(reply["text"] if op is Op.METRICS else json.dumps(reply, indent=2))


def _limits(policy: Path | None, example: bool) -> dict[str, Any]:
    path = policy_file(policy, example=example)
    with reported_errors():
        return CompactionLimits.from_policy(load_policy(path).kv_cache).__dict__


@kv_app.command()
def status(socket: SocketOpt = Path(SOCKET_PATH), token_file: TokenOpt = Path(TOKEN_PATH)) -> None:
    """Pool size, occupancy, fragmentation and load as the engine sees them."""
    _call(socket, token_file, Op.STATUS)


@kv_app.command()
def metrics(socket: SocketOpt = Path(SOCKET_PATH), token_file: TokenOpt = Path(TOKEN_PATH)) -> None:
    """The plugin's Prometheus metrics."""
    _call(socket, token_file, Op.METRICS)


@kv_app.command()
def compact(
    socket: SocketOpt = Path(SOCKET_PATH),
    token_file: TokenOpt = Path(TOKEN_PATH),
    policy: PolicyOpt = None,
    example: ExampleOption = False,
) -> None:
    """Pack occupied blocks into the low end of the pool (bounded by the policy)."""
    _call(socket, token_file, Op.COMPACT, limits=_limits(policy, example))


@kv_app.command()
def shrink(
    num_blocks: Annotated[int, typer.Argument(help="New pool size in blocks.")],
    socket: SocketOpt = Path(SOCKET_PATH),
    token_file: TokenOpt = Path(TOKEN_PATH),
    policy: PolicyOpt = None,
    example: ExampleOption = False,
) -> None:
    """Compact below NUM_BLOCKS, cut the pool to it and release the memory.

    The plugin refuses a NUM_BLOCKS below the shrink floor (blocks requests hold + one
    max_model_len sequence + the null block) and says what the floor is."""
    _call(socket, token_file, Op.SHRINK, num_blocks=num_blocks, limits=_limits(policy, example))


@kv_app.command()
def grow(
    num_blocks: Annotated[
        int | None, typer.Argument(help="New pool size (default: the starting size).")
    ] = None,
    socket: SocketOpt = Path(SOCKET_PATH),
    token_file: TokenOpt = Path(TOKEN_PATH),
) -> None:
    """Widen the pool again, at most to the size the engine started with."""
    _call(socket, token_file, Op.GROW, num_blocks=num_blocks)


@kv_app.command()
def run(
    metrics_url: Annotated[str, typer.Option("--metrics-url", help="The instance's /metrics.")],
    socket: SocketOpt = Path(SOCKET_PATH),
    token_file: TokenOpt = Path(TOKEN_PATH),
    policy: PolicyOpt = None,
    example: ExampleOption = False,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT of /metrics and POST /shrink.")
    ] = "127.0.0.1:9400",
    polls: Annotated[
        int, typer.Option("--polls", help="Stop after this many polls (0 = run forever).")
    ] = 0,
    workload: Annotated[
        str | None,
        typer.Option(help="This pod's workload: compaction requests must name it."),
    ] = None,
    compaction_token_file: Annotated[
        Path | None,
        typer.Option(
            help="Shared token also accepted on POST /compaction-requests (ignored if absent)."
        ),
    ] = None,
) -> None:
    """The sidecar: poll metrics, decide from the policy's triggers, drive the plugin.

    The policy file is re-read before every poll; a new valid version takes effect at once,
    an invalid one is logged and the last good policy stays in use."""
    from runtime.kvcache.sidecar.policy_file import PolicyFile
    from runtime.kvcache.sidecar.service import CompactionSidecar, serve_http

    configure_logging(logging.INFO)
    watched = PolicyFile(policy_file(policy, example=example))
    with reported_errors():
        loaded = watched.load()
        token = _token(token_file)
        host, port = host_port("--listen", listen)
    compaction_token = None
    if compaction_token_file is not None and compaction_token_file.exists():
        with reported_errors():
            compaction_token = _token(compaction_token_file)
    sidecar = CompactionSidecar(
        loaded, metrics_url, ControlClient(socket, token), watched, workload=workload
    )
    server = serve_http(sidecar, host, int(port), token, compaction_token)
    try:
        _polls(sidecar, polls)
    finally:
        server.shutdown()


def _polls(sidecar: CompactionSidecar, polls: int) -> None:
    """``polls`` polls (0: forever), one JSON line each on stderr, the policy's poll interval
    between them."""
    done = 0
    while polls == 0 or done < polls:
        decision, reply = sidecar.poll()
        typer.echo(json.dumps({"decision": decision.__dict__, "reply": reply}), err=True)
        done += 1
        if polls == 0 or done < polls:
            time.sleep(duration_seconds(sidecar.policy.kv_cache.compaction_poll_interval))


def register(app: typer.Typer) -> None:
    app.add_typer(kv_app)
