"""``gpupool kv-snapshots``: the snapshot GC loop of a flex pod, and a look at the volume."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.logs import configure_logging
from runtime.cli.options import host_port
from runtime.cli.policy_commands import ExampleOption, policy_file

if TYPE_CHECKING:
    from runtime.kvcache.preservation.gc import GcSettings, SnapshotGc
    from runtime.kvcache.preservation.retention import Plan
    from runtime.kvcache.preservation.volume import Applied, Budget
    from runtime.kvcache.sidecar.policy_file import PolicyFile

log = logging.getLogger(__name__)

snapshot_app = typer.Typer(
    name="kv-snapshots",
    help="The KV snapshot tier on a flex workload's volume: the GC, and what is on it.",
    no_args_is_help=True,
)

RootOpt = Annotated[Path, typer.Option("--root", help="Mount path of the snapshot volume.")]
PolicyOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        help="Policy file with the tier bounds (default: ./policy/pool.yaml).",
        show_default=False,
    ),
]
CapacityOpt = Annotated[
    int,
    typer.Option(
        "--capacity-bytes",
        help="Most bytes the tier may hold (the workload's snapshot_volume.tier_capacity).",
    ),
]


@snapshot_app.command()
def gc(
    root: RootOpt,
    capacity_bytes: CapacityOpt,
    policy: PolicyOpt = None,
    example: ExampleOption = False,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT of /metrics.")
    ] = "127.0.0.1:9400",
    passes: Annotated[
        int, typer.Option("--passes", help="Stop after this many passes (0 = run forever).")
    ] = 0,
) -> None:
    """Keep the tier within its capacity and reclaim stale trees; serve /metrics.

    The policy file (the GC interval, the reclaim age) is re-read before every pass: a new
    valid version applies at once, an invalid one is logged and the last good one stays."""
    from prometheus_client import CollectorRegistry, start_http_server

    from runtime.kvcache.preservation.gc import SnapshotGc, settings_for
    from runtime.kvcache.preservation.status import POD_ENV
    from runtime.kvcache.sidecar.policy_file import PolicyFile

    configure_logging(logging.INFO)
    watched = PolicyFile(policy_file(policy, example=example))
    with reported_errors():
        try:
            settings = settings_for(watched.load(), capacity_bytes)
        except ValueError as exc:
            raise UsageProblem(f"--capacity-bytes: {exc}") from None
        host, port = host_port("--listen", listen)
        if not root.is_dir():
            raise UsageProblem(f"--root: {root} is not a directory (is the volume mounted?)")
    registry = CollectorRegistry()
    collector = SnapshotGc(root, os.environ.get(POD_ENV) or socket.gethostname(), registry)
    server, thread = start_http_server(int(port), host, registry)
    try:
        _gc_passes(collector, watched, settings, capacity_bytes, passes)
    finally:
        server.shutdown()
        thread.join()


def _gc_passes(
    collector: SnapshotGc,
    watched: PolicyFile,
    settings: GcSettings,
    capacity_bytes: int,
    passes: int,
) -> None:
    """``passes`` passes (0: forever), the policy re-read before each, one JSON line per
    pass on stderr, the policy's interval between them."""
    from runtime.kvcache.preservation.gc import settings_for

    done = 0
    while passes == 0 or done < passes:
        reload = watched.refresh()
        for problem in reload.problems:
            log.warning("policy update refused, the last good one stays: %s", problem)
        if reload.policy is not None:
            settings = settings_for(reload.policy, capacity_bytes)
        decided, applied = collector.run_once(settings)
        typer.echo(json.dumps(_pass_record(decided, applied, collector.last_walk)), err=True)
        done += 1
        if passes == 0 or done < passes:
            time.sleep(settings.interval_s)


def _pass_record(decided: Plan, applied: Applied, walk: Budget | None) -> dict[str, object]:
    """What one pass did, as the GC's log line says it."""
    return {
        "used_bytes": decided.used_bytes,
        "kept_bytes": decided.kept_bytes,
        "deleted": applied.deleted_files,
        "errors": len(applied.errors),
        "passed_over": walk.skipped if walk else 0,
        "complete": not (walk and walk.expired),
    }


@snapshot_app.command()
def show(
    root: RootOpt,
    budget_s: Annotated[
        float, typer.Option("--budget-s", help="Longest the walk of the volume may take.")
    ] = 60.0,
) -> None:
    """The tiers on the volume (bytes, files, heartbeat age) and the replicas' records, as JSON;
    deletes nothing. Entries that are not directories or regular files (FIFOs, devices,
    symlinks), oversized records and what the budget did not reach are left out, and said so
    in ``walk``."""
    from runtime.kvcache.preservation.status import read_status, replicas_dir
    from runtime.kvcache.preservation.volume import Budget, records, scan

    with reported_errors():
        if not root.is_dir():
            raise UsageProblem(f"--root: {root} is not a directory")
        if not budget_s > 0:
            raise UsageProblem(f"--budget-s: expected more than 0 seconds, found {budget_s}")
    budget = Budget(budget_s)
    found = scan(root, budget)
    now = time.time()
    tiers = {
        name: {
            "heartbeat_age_s": round(now - beat, 1),
            "files": sum(1 for f in found.files if f.tier == name),
            "bytes": sum(f.size for f in found.files if f.tier == name),
        }
        for name, beat in sorted(found.heartbeats.items())
    }
    replicas = {
        path.name: record.model_dump()
        for path in records(replicas_dir(root), budget)
        if ".json" in path.name and (record := read_status(path, budget)) is not None
    }
    walk = {"complete": not budget.expired, "passed_over": budget.skipped, "note": budget.report()}
    typer.echo(json.dumps({"tiers": tiers, "replicas": replicas, "walk": walk}, indent=2))


def register(app: typer.Typer) -> None:
    app.add_typer(snapshot_app)
