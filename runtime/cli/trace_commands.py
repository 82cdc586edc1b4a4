"""``production-trace``: the owner's own production trace, from their Prometheus."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from policy import load_policy
from policy.base import duration_seconds
from policy.tuner import TRACE_MAX_STEPS
from runtime.atomic_file import OutputError, check_files, write_atomic
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.policy_commands import ExampleOption, input_files
from runtime.cli.policy_commands import policy_file as resolve_policy_file
from runtime.sim.traces import TraceError, demand_csv
from runtime.tuner.prometheus import TraceQueryError, connect, production_samples

MAX_SAMPLES = TRACE_MAX_STEPS
"""Steps one trace may hold (the tuner's advise lever has the same bound)."""


def production_trace(
    prometheus: Annotated[
        str, typer.Option(help="Prometheus URL (kube-state-metrics and dcgm-exporter).")
    ],
    out: Annotated[
        Path, typer.Option("--out", help="CSV to write: timestamp,gpus_demanded,duty_cycle.")
    ],
    policy_file: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            help="Policy file (default ./policy/pool.yaml): its priority class and dcgm labels.",
        ),
    ] = None,
    example: ExampleOption = False,
    window: Annotated[
        str, typer.Option(help="How far back from --end, a duration (7d, 24h).")
    ] = "7d",
    step: Annotated[str, typer.Option(help="Time between samples, a duration.")] = "1m",
    end: Annotated[
        float | None, typer.Option(help="Unix time the trace ends at (default: now).")
    ] = None,
) -> None:
    """Write production's GPU demand and duty cycle over a past window as a trace that
    ``gpupool whatif --prod-trace`` and ``gpupool advise --prod-trace`` replay."""
    with reported_errors():
        try:
            span, every = duration_seconds(window), duration_seconds(step)
        except ValueError as exc:
            raise UsageProblem(f"--window/--step: {exc}") from None
        if every <= 0 or span < 2 * every:
            raise UsageProblem(f"--window {window} must hold two --step {step} at least")
        if span / every > MAX_SAMPLES:
            raise UsageProblem(
                f"--window {window} at --step {step} is {span / every:,.0f} samples, over "
                f"{MAX_SAMPLES:,}; take a longer --step"
            )
        file = resolve_policy_file(policy_file, example=example)
        policy = load_policy(file)
        try:
            check_files([out], input_files(file, policy))
        except OutputError as exc:
            raise UsageProblem(str(exc)) from None
        stop = time.time() if end is None else end
        client = connect(prometheus)
        try:
            samples = production_samples(client, policy, start=stop - span, end=stop, step_s=every)
            text = demand_csv(samples, source=f"{prometheus} ({window} to {stop:.0f})")
        except (TraceQueryError, TraceError) as exc:
            raise UsageProblem(str(exc)) from None
        try:
            write_atomic(out, text)
        except OutputError as exc:
            raise UsageProblem(str(exc)) from None
    console.print(f"{out}: {len(samples):,} samples every {step} over {window}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(production_trace)
