"""``advise``: sweep policy variants on the owner's traces, show the trade-off, recommend one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress as RichProgress

from policy import load_policy
from runtime.advise import folder, front, levers, recommended, report
from runtime.advise.sweep import SweepError, run_sweep, sweep_options
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.policy_commands import ExampleOption, input_files
from runtime.cli.policy_commands import policy_file as resolve_policy_file
from runtime.cli.whatif_commands import DOMAIN_ERRORS, ProdTraceOption, print_table
from runtime.sim import options as replay_options
from runtime.tuner.yamledit import YamlEditError


def advise(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Folder for the table, JSON, plot and recommended.yaml (new or empty)."
        ),
    ],
    policy_file: Annotated[
        Path | None,
        typer.Option("--policy", help="Policy file (default ./policy/pool.yaml)."),
    ] = None,
    example: ExampleOption = False,
    prod_trace: ProdTraceOption = None,
    flex_trace: Annotated[
        list[str] | None,
        typer.Option(help="[WORKLOAD=]FILE[:CLASS] flex requests, as for whatif; repeatable."),
    ] = None,
    backlog: Annotated[
        list[str] | None,
        typer.Option(help="[WORKLOAD=]FILE[:CLASS] batch work always available; repeatable."),
    ] = None,
    vary: Annotated[
        list[str] | None,
        typer.Option(
            help="FIELD=V1,V2,... a field of the policy and the values to try (list entries by "
            "name: node_pools.gpu-prod.reserve_ratio=0.1,0.2; move_nodes=1,2; reserve=0.1,"
            "{replicas: 2, of: NS/NAME}); repeatable, swept as a grid. Default: the levers "
            "that matter for the policy."
        ),
    ] = None,
    hours: Annotated[
        float | None, typer.Option(min=0.01, max=24 * 14, help="Replay length (default: trace).")
    ] = None,
    budget_s: Annotated[
        float, typer.Option(min=1, help="Stop starting replays after this many seconds.")
    ] = 900.0,
    jobs: Annotated[
        int | None, typer.Option(min=1, max=256, help="Parallel processes (default: the CPUs).")
    ] = None,
    max_variants: Annotated[
        int, typer.Option(min=1, max=10_000, help="Refuse a sweep of more variants.")
    ] = levers.MAX_VARIANTS,
    ray: Annotated[
        str | None,
        typer.Option(help="Ray cluster address: run the replays there (pip install gpupool[ray])."),
    ] = None,
    target: Annotated[str, typer.Option(help="Node-pool target: labels or karpenter.")] = "labels",
) -> None:
    """Replay policy variants on your traces and recommend the one that harvests most with
    production unharmed; writes the table, JSON, a Pareto plot and recommended.yaml."""
    with reported_errors():
        if target not in ("labels", "karpenter"):
            raise UsageProblem(f"--target must be labels or karpenter, not {target!r}")
        file = resolve_policy_file(policy_file, example=example)
        policy = load_policy(file)
        try:
            chosen = [levers.parse_vary(v) for v in vary or ()]
            variants = levers.grid(policy, chosen) if chosen else levers.default_variants(policy)
        except levers.LeverError as exc:
            raise UsageProblem(str(exc)) from None
        if len(variants) > max_variants:
            raise UsageProblem(
                f"the sweep has {len(variants)} variants, over --max-variants {max_variants}; "
                "vary fewer values or raise --max-variants"
            )
        options = sweep_options(
            prod_trace,
            flex_traces=flex_trace or (),
            backlogs=backlog or (),
            hours=hours,
            target=target,  # type: ignore[arg-type]
        )
        inputs = input_files(file, policy) + replay_options.input_files(options)
        try:
            folder.check_folder(out, inputs)
        except folder.FolderError as exc:
            raise UsageProblem(str(exc)) from None
        workers = jobs or os.cpu_count() or 1
        with RichProgress(console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task(f"replaying {len(variants)} variants", total=len(variants))
            try:
                sweep = run_sweep(
                    policy,
                    file.parent,
                    variants,
                    options,
                    jobs=workers,
                    budget_s=budget_s,
                    ray_address=ray,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
            except (SweepError, *DOMAIN_ERRORS) as exc:
                raise UsageProblem(str(exc)) from None
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
                files |= recommended.recommended_files(
                    file,
                    policy,
                    pick.point.variant,
                    target=target,  # type: ignore[arg-type]
                )
            except (recommended.RecommendedError, YamlEditError) as exc:
                raise UsageProblem(str(exc)) from None
        try:
            folder.write_folder(out, files, inputs)
        except folder.FolderError as exc:
            raise UsageProblem(str(exc)) from None
    print_table(report.CONSOLE_COLUMNS, report.console_rows(report.table_rows(rated, pick)))
    console.print(report.recommendation_line(sweep, pick), markup=False)
    console.print(report.front_line(rated), markup=False)
    for point in sweep.points:
        if point.summary is None:
            console.print(f"not replayed: {point.variant.name}: {point.problem}", markup=False)
    console.print(f"{out}: {', '.join(sorted(files))}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(advise)
