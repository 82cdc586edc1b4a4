"""``advise``: sweep policy variants on the owner's traces, show the trade-off, recommend one."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.progress import Progress as RichProgress

from infra.builders.stack_options import Target
from policy import PoolPolicy, load_policy
from runtime.advise import folder, front, levers, recommended, report
from runtime.advise.front import Rated
from runtime.advise.levers import Variant
from runtime.advise.sweep import Sweep, SweepError, run_sweep, sweep_options
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.options import HoursOption, ProdTraceOption, TargetOption
from runtime.cli.policy_commands import ExampleOption, input_files
from runtime.cli.policy_commands import policy_file as resolve_policy_file
from runtime.cli.whatif_commands import DOMAIN_ERRORS, print_table
from runtime.sim.options import Options
from runtime.sim.options import input_files as replay_inputs
from runtime.tuner.yamledit import YamlEditError

OutOption = Annotated[
    Path,
    typer.Option(
        "--out", help="Folder for the table, JSON, plot and recommended.yaml (new or empty)."
    ),
]
PolicyOption = Annotated[
    Path | None,
    typer.Option("--policy", help="Policy file (default ./policy/pool.yaml)."),
]
FlexTraceOption = Annotated[
    list[str] | None,
    typer.Option(help="[WORKLOAD=]FILE[:CLASS] flex requests, as for whatif; repeatable."),
]
BacklogOption = Annotated[
    list[str] | None,
    typer.Option(help="[WORKLOAD=]FILE[:CLASS] batch work always available; repeatable."),
]
VaryOption = Annotated[
    list[str] | None,
    typer.Option(
        help="FIELD=V1,V2,... a field of the policy and the values to try (list entries by "
        "name: node_pools.gpu-prod.reserve_ratio=0.1,0.2; move_nodes=1,2; reserve=0.1,"
        "{replicas: 2, of: NS/NAME}); repeatable, swept as a grid. Default: the levers "
        "that matter for the policy."
    ),
]
BudgetOption = Annotated[
    float, typer.Option(min=1, help="Stop starting replays after this many seconds.")
]
JobsOption = Annotated[
    int | None, typer.Option(min=1, max=256, help="Parallel processes (default: the CPUs).")
]
MaxVariantsOption = Annotated[
    int, typer.Option(min=1, max=10_000, help="Refuse a sweep of more variants.")
]
RayOption = Annotated[
    str | None,
    typer.Option(help="Ray cluster address: run the replays there (pip install gpupool[ray])."),
]


@dataclass(frozen=True)
class SweepLimits:
    """How the sweep may run: its size, its time, and where its replays go."""

    max_variants: int
    budget_s: float
    jobs: int | None
    """Parallel processes; None: the CPUs."""
    ray: str | None
    """A Ray cluster's address; None: local processes."""


@dataclass(frozen=True)
class Advice:
    """A finished sweep: every point rated, the pick (None: none is safe) and the files."""

    sweep: Sweep
    rated: list[Rated]
    pick: Rated | None
    files: dict[str, bytes]


def advise(
    out: OutOption,
    policy_file: PolicyOption = None,
    example: ExampleOption = False,
    prod_trace: ProdTraceOption = None,
    flex_trace: FlexTraceOption = None,
    backlog: BacklogOption = None,
    vary: VaryOption = None,
    hours: HoursOption = None,
    budget_s: BudgetOption = 900.0,
    jobs: JobsOption = None,
    max_variants: MaxVariantsOption = levers.MAX_VARIANTS,
    ray: RayOption = None,
    target: TargetOption = "labels",
) -> None:
    """Replay policy variants on your traces and recommend the one that harvests most with
    production unharmed; writes the table, JSON, a Pareto plot and recommended.yaml."""
    limits = SweepLimits(max_variants=max_variants, budget_s=budget_s, jobs=jobs, ray=ray)
    with reported_errors():
        checked_target = _target(target)
        file = resolve_policy_file(policy_file, example=example)
        policy = load_policy(file)
        variants = _variants(policy, vary or (), limits.max_variants)
        options = sweep_options(
            prod_trace,
            flex_traces=flex_trace or (),
            backlogs=backlog or (),
            hours=hours,
            target=checked_target,
        )
        inputs = input_files(file, policy) + replay_inputs(options)
        _check_folder(out, inputs)
        sweep = _sweep(file, policy, variants, options, limits)
        advice = _advice(file, policy, sweep, checked_target)
        _write_folder(out, advice.files, inputs)
    _print_advice(out, advice)


def _target(target: str) -> Target:
    if target not in ("labels", "karpenter"):
        raise UsageProblem(f"--target must be labels or karpenter, not {target!r}")
    return cast(Target, target)


def _variants(policy: PoolPolicy, vary: Sequence[str], max_variants: int) -> list[Variant]:
    """The ``--vary`` grid (default: the levers that matter), refused over ``max_variants``."""
    try:
        chosen = [levers.parse_vary(v) for v in vary]
        variants = levers.grid(policy, chosen) if chosen else levers.default_variants(policy)
    except levers.LeverError as exc:
        raise UsageProblem(str(exc)) from None
    if len(variants) > max_variants:
        raise UsageProblem(
            f"the sweep has {len(variants)} variants, over --max-variants {max_variants}; "
            "vary fewer values or raise --max-variants"
        )
    return variants


def _check_folder(out: Path, inputs: list[Path]) -> None:
    """``folder.check_folder`` before the long work, a refusal as one line."""
    try:
        folder.check_folder(out, inputs)
    except folder.FolderError as exc:
        raise UsageProblem(str(exc)) from None


def _write_folder(out: Path, files: dict[str, bytes], inputs: list[Path]) -> None:
    """``folder.write_folder``, a refusal as one line."""
    try:
        folder.write_folder(out, files, inputs)
    except folder.FolderError as exc:
        raise UsageProblem(str(exc)) from None


def _sweep(
    file: Path, policy: PoolPolicy, variants: list[Variant], options: Options, limits: SweepLimits
) -> Sweep:
    """Every variant replayed (locally or on Ray) with a progress bar; errors as one line."""
    workers = limits.jobs or os.cpu_count() or 1
    with RichProgress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"replaying {len(variants)} variants", total=len(variants))
        try:
            return run_sweep(
                policy,
                file.parent,
                variants,
                options,
                jobs=workers,
                budget_s=limits.budget_s,
                ray_address=limits.ray,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
        except (SweepError, *DOMAIN_ERRORS) as exc:
            raise UsageProblem(str(exc)) from None


def _advice(file: Path, policy: PoolPolicy, sweep: Sweep, target: Target) -> Advice:
    """The sweep rated, the pick, and the folder's files: the table, JSON, plot and (with a
    pick) recommended.yaml with what it names."""
    rated = front.rate(sweep.points, sweep.fixed)
    pick = front.recommend(rated)
    files = {
        "advise.md": report.markdown(sweep, rated, pick).encode("utf-8"),
        "advise.json": json.dumps(
            report.as_json(sweep, rated, pick), indent=1, sort_keys=True
        ).encode("utf-8"),
        report.PLOT: report.plot(sweep, rated, pick),
    }
    if pick is not None:
        try:
            files |= recommended.recommended_files(file, policy, pick.point.variant, target=target)
        except (recommended.RecommendedError, YamlEditError) as exc:
            raise UsageProblem(str(exc)) from None
    return Advice(sweep, rated, pick, files)


def _print_advice(out: Path, advice: Advice) -> None:
    sweep, rated, pick = advice.sweep, advice.rated, advice.pick
    print_table(report.CONSOLE_COLUMNS, report.console_rows(report.table_rows(rated, pick)))
    console.print(report.recommendation_line(sweep, pick), markup=False)
    console.print(report.front_line(rated), markup=False)
    for point in sweep.points:
        if point.summary is None:
            console.print(f"not replayed: {point.variant.name}: {point.problem}", markup=False)
    console.print(f"{out}: {', '.join(sorted(advice.files))}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(advise)
