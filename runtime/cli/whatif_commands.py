"""``whatif``: replay traces through the closed loop under a policy, or two refs of it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress as RichProgress

from infra.builders.workload import HPA_TOLERANCES
from policy import load_policy
from runtime import atomic_file
from runtime.cli import tables
from runtime.cli.consoles import console
from runtime.cli.errors import UsageProblem, reported_errors
from runtime.cli.policy_commands import ExampleOption, input_files
from runtime.cli.policy_commands import policy_file as resolve_policy_file
from runtime.sim import class_text, markdown, output, tuner_text
from runtime.sim import options as replay_options
from runtime.sim.gitrefs import RefError, policy_at
from runtime.sim.options import DEMO, Options, build_whatif
from runtime.sim.service_time import ServiceTimeError
from runtime.sim.traces import (
    TraceError,
)
from runtime.sim.whatif import Result, WhatIfError, run
from runtime.vllm import BackendError, KvPlanError, ModelConfigError

"""``soft_wrap``: a line stays one line in a pipe (the terminal wraps it on screen)."""

DOMAIN_ERRORS = (
    TraceError,
    WhatIfError,
    ServiceTimeError,
    RefError,
    ModelConfigError,
    KvPlanError,
    BackendError,
)


def replay(policy_file: Path, options: Options, label: str) -> Result:
    """Load the policy and the traces, then run both replays with a progress bar."""
    policy = load_policy(policy_file)
    whatif = build_whatif(options, policy)
    with RichProgress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"replaying {label}", total=whatif.settings.steps)
        return run(
            policy,
            policy_file.parent,
            whatif,
            progress=lambda done, total: bar.update(task, completed=done),
        )


ProdTraceOption = Annotated[
    str | None,
    typer.Option(
        help="Production trace: Alibaba duty-cycle CSV, timestamp,gpus_demanded[,duty_cycle] "
        "CSV (gpupool production-trace writes one), or 'diurnal' (default: the bundled "
        "Alibaba sample)."
    ),
]
"""``--prod-trace`` of every command that replays."""


def print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table whose values stay whole at any width (``tables.print_table``)."""
    tables.print_table(console, headers, rows)


def print_summary(result: Result, title: str) -> None:
    tables.print_table(
        console,
        ("", "pooled", "fixed topology"),
        markdown.rows(result.pooled, result.fixed),
        title=title,
    )
    console.print(markdown.headline(result).replace("**", ""), markup=False)
    for line in markdown.notable_lines(result):
        console.print(line, markup=False)
    for line in markdown.check_lines(result.pooled):
        console.print(line, markup=False)
    for line in markdown.goal_lines(result):
        console.print(line, markup=False)
    print_classes(result)
    if result.tuner is not None:
        print_tuner(result)


def print_classes(result: Result) -> None:
    """Per traffic class: served, queued, shed (and during production bursts), lost, dropped;
    nothing for a policy without a serving section."""
    rows = class_text.class_rows(result.pooled, result.fixed)
    if not rows:
        return
    head, *_ = class_text.class_lines(result.pooled, result.fixed)
    console.print(head, markup=False)
    # One column per class and replay (the markdown's rows), so ten figures fit 80 columns.
    tables.print_table(
        console,
        ("", *(f"{row[0]} {row[1]}" for row in rows)),
        [
            (figure, *(row[i] for row in rows))
            for i, figure in enumerate(class_text.CLASS_COLUMNS[2:], start=2)
        ],
    )


def print_tuner(result: Result) -> None:
    """The tuner's proposals as a table (when, what, outcome, effect), each one's reason
    below it; without a proposal, the last cycle's reasons."""
    tuner = result.tuner
    assert tuner is not None
    head, *rest = tuner_text.tuner_lines(tuner)
    console.print(head, markup=False)
    if not tuner.proposals:
        for line in rest:
            console.print(line, markup=False)
        return
    tables.print_table(
        console,
        ("proposed", "change", "outcome", "before -> after"),
        [
            (
                tuner_text.clock(p.proposed_at_s),
                tuner_text.change_text(p),
                tuner_text.outcome_text(p),
                tuner_text.effect_text(p),
            )
            for p in tuner.proposals
        ],
    )
    for p in tuner.proposals:
        console.print(f"why ({tuner_text.clock(p.proposed_at_s)}, {p.rule}): {p.why}", markup=False)


def output_files(
    *, json_out: Path | None, plots: Path | None, markdown_out: Path | None, prefixes: list[str]
) -> list[Path]:
    """Every file a run writes: the JSON, the markdown and each plot."""
    named = [p for p in (json_out, markdown_out) if p is not None]
    if plots is None:
        return named
    return named + [plots / f"{prefix}{name}" for prefix in prefixes for name in output.PLOTS]


def check_outputs(outputs: list[Path], inputs: list[Path]) -> None:
    """``atomic_file.check_files`` before the replay, its refusal as one line."""
    try:
        atomic_file.check_files(outputs, inputs)
    except atomic_file.OutputError as exc:
        raise UsageProblem(str(exc)) from None


def write_set(files: dict[Path, bytes], inputs: Sequence[Path]) -> None:
    """The run's files as one set (all old or all new), a failure as one line."""
    try:
        atomic_file.write_files(files, inputs)
    except atomic_file.OutputError as exc:
        raise UsageProblem(str(exc)) from None


def write_outputs(
    result: Result,
    *,
    json_out: Path | None,
    plots: Path | None,
    markdown_out: Path | None,
    inputs: Sequence[Path] = (),
) -> list[str]:
    """Write the JSON, plots and report as one set; return the plots' paths."""
    files: dict[Path, bytes] = {}
    if plots is not None:
        files |= {plots / name: data for name, data in output.plots(result).items()}
    written = list(files)
    if json_out is not None:
        files[json_out] = output.json_bytes(result)
    if markdown_out is not None:
        links = output.relative(written, markdown_out)
        files[markdown_out] = markdown.report(result, plots=links).encode("utf-8")
    write_set(files, inputs)
    return [str(p) for p in written]


def whatif(
    policy_file: Annotated[
        Path | None,
        typer.Option("--policy", help="Policy file (default: ./policy/pool.yaml)."),
    ] = None,
    example: ExampleOption = False,
    base: Annotated[
        str | None, typer.Option(help="Git ref of the policy before the change.")
    ] = None,
    head: Annotated[
        str | None, typer.Option(help="Git ref of the policy after the change.")
    ] = None,
    repo: Annotated[Path, typer.Option(help="Policy repository for --base/--head.")] = Path("."),
    policy_path: Annotated[
        str, typer.Option(help="Policy file inside the repository.")
    ] = "policy/pool.yaml",
    prod_trace: ProdTraceOption = None,
    flex_trace: Annotated[
        list[str] | None,
        typer.Option(
            help="[WORKLOAD=]FILE[:CLASS] flex requests (Azure CSV or Mooncake JSONL; "
            "'azure-code' and 'mooncake' name the bundled ones); repeatable. CLASS: a traffic "
            "class of the policy's serving section (default: its first class served by flex). "
            "Default: both bundled traces."
        ),
    ] = None,
    backlog: Annotated[
        list[str] | None,
        typer.Option(
            help="[WORKLOAD=]FILE[:CLASS] batch work always available (lengths from FILE); "
            "CLASS: a traffic class served by flex."
        ),
    ] = None,
    rate_scale: Annotated[
        float, typer.Option(min=0.001, help="Multiply flex arrival rates.")
    ] = 1.0,
    hours: Annotated[
        float | None, typer.Option(min=0.01, max=24 * 14, help="Replay length (default: trace).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated production trace.")] = 0,
    layout: Annotated[
        str,
        typer.Option(
            help="policy: the pools as declared; trace: resizes the hardware to the trace "
            "(production's peak plus the flex pool), said in the report's assumptions."
        ),
    ] = "policy",
    fit_production: Annotated[
        bool, typer.Option(help="Scale a production trace larger than the cluster to fit it.")
    ] = False,
    production_rule: Annotated[
        str,
        typer.Option(
            help="policy: the policy's production workloads (duty without them); "
            "duty: one-GPU replicas follow busy GPU-equivalents; held: the trace's GPUs."
        ),
    ] = "policy",
    prod_target_utilization: Annotated[
        float,
        typer.Option(
            min=0.05, max=1.0, help="Duty rule and scale_on: external: target duty per replica."
        ),
    ] = 0.6,
    startup_s: Annotated[
        float, typer.Option(min=0, help="Pod start-up: image pull + model load, seconds.")
    ] = 300.0,
    target: Annotated[str, typer.Option(help="Node-pool target: labels or karpenter.")] = "labels",
    hpa_tolerance: Annotated[
        str,
        typer.Option(help="Flex HPA tolerance: cluster (controller flag) or behavior (per-HPA 0)."),
    ] = "cluster",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the result as JSON.")
    ] = None,
    plots: Annotated[Path | None, typer.Option(help="Folder for the PNG plots.")] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="Write the report (or PR comment) here.")
    ] = None,
    tuner: Annotated[
        bool,
        typer.Option(
            "--tuner",
            help="Run the tuner's decisions in the pooled loop every tuner interval and merge "
            "its proposals after --review-delay.",
        ),
    ] = False,
    tuner_settings: Annotated[
        Path | None,
        typer.Option(help="The tuner's settings file (as gpupool tune --settings)."),
    ] = None,
    review_delay: Annotated[
        str | None,
        typer.Option(help="From a proposal to its merge, e.g. 30m (default: one tuner interval)."),
    ] = None,
) -> None:
    """Replay production and flex traces through the closed loop; compare with fixed GPUs."""
    with reported_errors(), _domain_errors():
        options = Options(
            prod_trace,
            tuple(flex_trace or ()),
            tuple(backlog or ()),
            rate_scale,
            hours,
            seed,
            _choice("--layout", layout, ("policy", "trace")),  # type: ignore[arg-type]
            fit_production,
            _choice("--production-rule", production_rule, ("policy", "duty", "held")),  # type: ignore[arg-type]
            prod_target_utilization,
            startup_s,
            _choice("--target", target, ("labels", "karpenter")),  # type: ignore[arg-type]
            _choice("--hpa-tolerance", hpa_tolerance, HPA_TOLERANCES),  # type: ignore[arg-type]
            tuner=tuner,
            tuner_settings=None if tuner_settings is None else str(tuner_settings),
            review_delay=review_delay,
        )
        if (base is None) != (head is None):
            raise UsageProblem("--base and --head go together")
        if base is not None and head is not None:
            if policy_file is not None or example:
                raise UsageProblem("use either --policy (or --example) or --base/--head")
            _compare(repo, policy_path, base, head, options, json_out, plots, markdown_out)
            return
        file = resolve_policy_file(policy_file, example=example)
        inputs = input_files(file, load_policy(file)) + replay_options.input_files(options)
        outs = output_files(
            json_out=json_out, plots=plots, markdown_out=markdown_out, prefixes=[""]
        )
        check_outputs(outs, inputs)
        result = replay(file, options, str(file))
        names = write_outputs(
            result, json_out=json_out, plots=plots, markdown_out=markdown_out, inputs=inputs
        )
    print_summary(result, f"What-if: {file}, {result.pooled.hours:g} h")
    for name in names:
        console.print(f"plot: {name}", markup=False)


def _compare(
    repo: Path,
    policy_path: str,
    base: str,
    head: str,
    options: Options,
    json_out: Path | None,
    plots: Path | None,
    markdown_out: Path | None,
) -> None:
    inputs = replay_options.input_files(options)
    check_outputs(
        output_files(
            json_out=json_out, plots=plots, markdown_out=markdown_out, prefixes=["head-", "base-"]
        ),
        inputs,
    )
    with tempfile.TemporaryDirectory(prefix="gpupool-whatif-") as tmp:
        results = {}
        for name, ref in (("base", base), ("head", head)):
            file = policy_at(repo, ref, policy_path, Path(tmp) / name)
            results[name] = replay(file, options, f"{name} {ref}")
    files: dict[Path, bytes] = {}
    if plots is not None:
        for prefix in ("head-", "base-"):
            images = output.plots(results[prefix[:-1]], prefix=prefix)
            files |= {plots / name: data for name, data in images.items()}
    written = [p for p in files if p.name.startswith("head-")]
    # named from the comment's folder, as the CI artifact holds them
    names = (
        [str(p) for p in written]
        if markdown_out is None
        else output.relative(written, markdown_out)
    )
    text = markdown.comparison(
        results["base"], results["head"], base_ref=base, head_ref=head, plots=names
    )
    if json_out is not None:
        both = {k: output.as_json(v) for k, v in results.items()}
        files[json_out] = json.dumps(both, indent=1, sort_keys=True).encode("utf-8")
    if markdown_out is not None:
        files[markdown_out] = text.encode("utf-8")
    write_set(files, inputs)
    print_summary(results["base"], f"base {base}")
    print_summary(results["head"], f"head {head}")


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageProblem(f"{option} must be one of {', '.join(allowed)}, not {value!r}")
    return value


@contextmanager
def _domain_errors() -> Iterator[None]:
    """Turn the replay's domain errors into one line (``UsageProblem``)."""
    try:
        yield
    except DOMAIN_ERRORS as exc:
        raise UsageProblem(str(exc)) from None


def replay_demo(out: Path, policy_file: Path) -> None:
    """The demo's replay of ``policy_file`` on the bundled traces; report, plots and JSON
    under ``out``."""
    with reported_errors(), _domain_errors():
        paths = {"json_out": out / "whatif.json", "plots": out, "markdown_out": out / "report.md"}
        inputs = input_files(policy_file, load_policy(policy_file))
        check_outputs(output_files(**paths, prefixes=[""]), inputs)
        result = replay(policy_file, DEMO, "the bundled traces")
        names = write_outputs(result, **paths, inputs=inputs)
    print_summary(result, f"What-if on the bundled traces, {result.pooled.hours:g} h")
    console.print(f"{out}: report.md, whatif.json, {len(names)} plots", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(whatif)
