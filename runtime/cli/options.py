"""Typer options that several commands share, declared once so that their flags, limits and
help texts cannot drift apart between ``whatif`` and ``advise``; and the ``HOST:PORT`` check
of the options that name an address."""

from __future__ import annotations

from typing import Annotated

import typer

from runtime.cli.errors import UsageProblem

ProdTraceOption = Annotated[
    str | None,
    typer.Option(
        help="Production trace: Alibaba duty-cycle CSV, timestamp,gpus_demanded[,duty_cycle] "
        "CSV (gpupool production-trace writes one), or 'diurnal' (default: the bundled "
        "Alibaba sample)."
    ),
]
"""``--prod-trace`` of every command that replays."""

HoursOption = Annotated[
    float | None, typer.Option(min=0.01, max=24 * 14, help="Replay length (default: trace).")
]
"""``--hours``: at most two weeks of replay."""

TargetOption = Annotated[str, typer.Option(help="Node-pool target: labels or karpenter.")]
"""``--target``: the node-pool target the replay renders for (default ``labels``)."""


def host_port(option: str, value: str) -> tuple[str, str]:
    """``HOST:PORT`` of ``option`` as host and port text, checked before anything binds or
    is sent (a wrong one is a ``UsageProblem`` naming the option)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise UsageProblem(f"{option}: expected HOST:PORT, found {value!r}")
    return host, port
